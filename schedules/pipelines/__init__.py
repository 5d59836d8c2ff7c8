"""Pipeline schedule families, one module each; every module lists its ScheduleEntry
objects in SCHEDULES and schedules.registry collects them (docs/architecture.md)."""
