"""A discrete-event cluster simulator: simulated nodes, sites and time driving the real strategies.

No HTTP, no Redis, no processes: :class:`~scheduler_ext.sim.engine.Simulation` keeps the scheduling state in
memory and runs the control's own :func:`~scheduler_ext.control.decide` on snapshots of it, with the same
:class:`~scheduler_ext.strategies.Allocation`, ``Modification`` and ``Recall`` objects the control uses, and the
estimates the finish script keeps (:mod:`scheduler_ext.sim.estimates` applies the
same updates as ``lua/finish.lua``). A :class:`~scheduler_ext.sim.world.World` says how each site treats each node
over time; :mod:`scheduler_ext.sim.families` generates worlds for the benchmarks, and :mod:`scheduler_ext.sim.bound`
computes the best possible collection a world allows. docs/strategies.md describes the model and its calibration.
"""

from __future__ import annotations

from .engine import FREE_CONTROL, ControlModel, NodeModel, SimNode, Simulation, TaskSpec
from .world import Behaviour, World

__all__ = ["FREE_CONTROL", "Behaviour", "ControlModel", "NodeModel", "SimNode", "Simulation", "TaskSpec", "World"]
