"""clustersim: a discrete-event cluster simulator for distributed LLM training, with a
real-kernel backend. This file is the `clustersim` package: pyproject.toml maps the
repository root to it, so the folders `schedules/`, `topologies/`, `sim/` and `kernels/`
install as `clustersim.schedules`, `clustersim.topologies`, `clustersim.sim` and
`clustersim.kernels` (docs/architecture.md describes the layers).

The Python API below is imported lazily (PEP 562), so `import clustersim.schedules` stays
standard-library only and `import clustersim` never imports torch:

    import clustersim
    model = clustersim.get_model("llama3-8b")
    parallel = clustersim.ParallelConfig(pp=8, num_microbatches=16)
    timeline = clustersim.simulate(model, parallel, clustersim.load_topology("dgx-h100"))
    print(timeline.iteration_time, timeline.bubble_fraction)
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {  # name -> module that defines it
    "ModelSpec": "clustersim.schedules.model",
    "get_model": "clustersim.schedules.model_presets",
    "MODEL_PRESETS": "clustersim.schedules.model_presets",
    "ParallelConfig": "clustersim.schedules.parallel",
    "Schedule": "clustersim.schedules.schedule",
    "build_schedule": "clustersim.schedules.registry",
    "SCHEDULES": "clustersim.schedules.registry",
    "Timeline": "clustersim.schedules.timeline",
    "load_topology": "clustersim.topologies",
    "simulate": "clustersim.sim.simulate",
    "plan": "clustersim.sim.planner",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'clustersim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
