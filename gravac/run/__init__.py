"""Run orchestration: one run's processes (launch), sweeps (sweep) and their jobs (jobs)."""
