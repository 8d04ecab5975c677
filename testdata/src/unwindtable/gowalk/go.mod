module profsym.test/gowalk

go 1.18
