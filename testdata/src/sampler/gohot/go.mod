module profsym.test/gohot

go 1.26
