"""The pipeline: nodes that fetch, lock, send and commit the tasks of one queue, and the runtime hosting them.

``node`` is the loop (fetch, claim, dispatch); ``flight`` a task in flight as a state
machine; ``send`` the supervision of the user's send; ``settle`` commit, retry and
hand-back; ``keeper`` lease renewal; ``delivery`` what a running send can know;
``config`` the :class:`NodeConfig`; ``runtime`` many nodes in one process, with
``idlepoll`` (one idle poll for all of them), ``running`` (a process exit stops every
runtime) and ``drainhint`` (why a drain may never end). ``ablation`` holds the switches
benchmarks use to measure each layer. The pipeline depends on the store contract
(:mod:`asynccoord.contract`), never on an engine.
"""

from .config import NodeConfig
from .delivery import Delivery, current_delivery
from .node import Node
from .runtime import Runtime
from .status import NodeState, NodeStatus

__all__ = ("Delivery", "Node", "NodeConfig", "NodeState", "NodeStatus", "Runtime", "current_delivery")
