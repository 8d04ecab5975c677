module golabelsfixture

go 1.19
