module profsym.test/cgo

go 1.21
