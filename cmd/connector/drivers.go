package main

import "weida.dev/connector/cmd/drivers"

// programDrivers returns the drivers of every protocol the connector
// speaks: the one list, in [drivers.All]. Every subcommand takes it from
// here. It is a variable only so that a test can add a protocol the way a
// contributor does, with one more entry in that list, and see check,
// explain and run treat it exactly as the protocol it copies.
var programDrivers = drivers.All
