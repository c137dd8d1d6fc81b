"""Support shared by the tests and the benchmarks: waiting on a condition, a live pearld, a
realistic stream of log records, the controller model. The library never imports it."""
