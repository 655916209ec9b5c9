"""The simulated (and real) cluster: workers' communication groups (comm), the network model,
the device profile and op costs, the DDP-like timeline and the modelled clock, and the host."""
