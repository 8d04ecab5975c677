module fixture

go 1.18
