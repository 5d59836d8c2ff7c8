"""The same schedules on real devices with torch.distributed (NCCL on GPUs, gloo on CPU),
returning measured Timelines for calibration. Imports schedules and torch only — never sim
or topologies (DESIGN.md). The backend itself lands with issue 4; install it with
`pip install -e '.[kernels]'`."""
