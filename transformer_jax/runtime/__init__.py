"""Where a run runs: the device mesh and its logical-axis rules, multi-process start-up, the backends a tool starts,
XLA options, concurrent compiles and the host's memory and cores, and whether Pallas kernels are interpreted."""
