"""The ``imagegc`` process: image GC and container GC over CRI (gc.py: the rules; service.py:
the periods, the usage source, events and metric; main.py: composition)."""

from podvisor.services.imagegc.gc import (
    ContainerPlan,
    ImagePlan,
    ImageTracker,
    Usage,
    container_gc_pass,
    image_gc_pass,
    plan_container_gc,
    plan_image_gc,
)

__all__ = ["ContainerPlan", "ImagePlan", "ImageTracker", "Usage", "container_gc_pass",
           "image_gc_pass", "plan_container_gc", "plan_image_gc"]
