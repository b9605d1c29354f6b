"""rankcore: stable, contiguous replica ranks as a pure state machine.

``step(state, event) -> Step(state, commands)``; no I/O, clock or randomness.
See README.md for a quick start and docs/architecture.md for the design.

The public surface (docs/embedding.md, "What you may import"): this package's
names (``__all__``: the events, the commands, ``step`` / ``run`` / ``State`` and its records, the
errors, and the namespaces ``query`` (what an executor asks of a state), ``options``, ``placement``,
``gangs``, ``static``, ``cluster``, ``health``, ``restarts``, ``spares``, ``tiers`` and
``autoscaling``), ``rankcore.testing``,
``rankcore.invariants``, ``rankcore.protocol``, ``rankcore.base.records`` and ``rankcore.requests``.
Every other module is internal: it may change without notice.

The modules live in one folder per plane (docs/architecture.md): ``base/``, ``placement/``,
``tiers/``, ``control/``, ``requests/``. The namespaces above are attributes of this package
(``rankcore.options``), imported from their plane's module (``rankcore.base.options``).
"""

from . import placement, query, tiers
from .base import cluster, options
from .base.bundles import StaticPlacement, consecutive_mapping
from .base.commands import (
    PROXY_STOP_REASONS,
    Command,
    DrainProxy,
    DropWarmCopy,
    EvictReplica,
    GangChanged,
    InitializeReplica,
    KeepSpareProcesses,
    LoadReplica,
    OffloadReplica,
    PlaceReplica,
    PoolChanged,
    PoolComing,
    PoolCommand,
    PoolReset,
    ReconfigureReplica,
    ReformGroup,
    ReplicaModels,
    RequestResources,
    ScheduleTick,
    StartProxy,
    StartReplica,
    StopProxy,
    StopReplica,
    UpdateHealthChecks,
    UpdateWeights,
    UpdateWorldSize,
)
from .base.errors import (
    REQUEST_ERRORS,
    InvalidConfig,
    InvalidEvent,
    InvariantViolation,
    Overloaded,
    RankConflict,
    RankcoreError,
    ReplicaDied,
    RequestCancelled,
    RequestError,
    RequestTimeout,
    Unavailable,
    UnknownDeployment,
    UnknownReplica,
)
from .base.events import (
    CRASH_CAUSES,
    DEFAULT_MAX_REPLICAS,
    OUTDATED,
    UNKNOWN,
    AutoscalingMetrics,
    BundlesPlaced,
    ControllerRecovered,
    DeploymentApplied,
    DeploymentDeleted,
    Event,
    HealthChecked,
    ModelsReported,
    NodeCapacityChanged,
    NodeDraining,
    NodeJoined,
    NodeLost,
    PlacementFailed,
    ProxiesConfigured,
    ProxyCrashed,
    ProxyHealthChecked,
    ProxyStarted,
    ReplicaCrashed,
    ReplicaPlaced,
    ReplicaReady,
    ReplicaReconfigured,
    ReplicaReport,
    ReplicaStopped,
    ScaleRequested,
    SleepRequested,
    Tick,
    TierMoved,
    TierMoveFailed,
    UnresponsiveReplica,
    WakeRequested,
    WarmCopy,
    WeightsPushed,
    WeightsUpdated,
)
from .base.fields import shown
from .base.gangmap import GangContext
from .base.groupmap import GroupContext
from .base.lifecycle import LIVE, Phase, Residency
from .base.options import DeploymentConfig, Options
from .base.proxybook import PROXY_LOCATIONS, Proxy, ProxyBook, ProxyLocation, ProxyOptions, ProxyPhase
from .base.ranks import MAX_RANKS, LowerBound, RankTable, Reassignment, ReplicaRank, ReportedRank
from .base.state import (
    STATUSES,
    Autoscaler,
    Compaction,
    Deployment,
    RecoveryOutcome,
    Replica,
    State,
    Step,
)
from .control import autoscaling, health
from .control.autoscaling import PolicyContext, register_policy
from .control.pool import PoolView
from .core import run, step
from .placement import gangs, restarts, spares, static

__version__ = "0.1.0"

__all__ = [
    "step", "run", "query", "State", "Step", "Deployment", "Replica", "Phase", "Compaction", "RecoveryOutcome",
    "placement",
    "RankTable", "ReplicaRank", "ReportedRank", "Reassignment", "LowerBound",
    "DeploymentApplied", "ScaleRequested", "DeploymentDeleted", "ReplicaPlaced", "ReplicaReady",
    "ReplicaReconfigured", "ReplicaCrashed", "ReplicaStopped", "NodeLost", "HealthChecked", "CRASH_CAUSES",
    "DeploymentConfig", "Options", "options", "health", "restarts", "spares",
    "NodeJoined", "NodeCapacityChanged", "PlacementFailed", "Tick", "PlaceReplica", "ScheduleTick", "cluster",
    "ReplicaReport", "ControllerRecovered", "UnresponsiveReplica", "WarmCopy", "Event", "UNKNOWN", "OUTDATED", "DEFAULT_MAX_REPLICAS",
    "StartReplica", "InitializeReplica", "ReconfigureReplica", "StopReplica",
    "UpdateWorldSize", "UpdateHealthChecks", "Command", "GangChanged", "ReformGroup", "GroupContext", "KeepSpareProcesses", "GangContext", "BundlesPlaced", "StaticPlacement",
    "consecutive_mapping", "gangs", "static", "tiers",
    "SleepRequested", "WakeRequested", "WeightsPushed", "TierMoved", "TierMoveFailed", "WeightsUpdated",
    "OffloadReplica", "LoadReplica", "UpdateWeights", "EvictReplica", "DropWarmCopy", "RequestResources", "PoolChanged", "PoolReset", "PoolComing", "PoolCommand", "PoolView", "Residency",
    "LIVE", "MAX_RANKS", "STATUSES",
    "AutoscalingMetrics", "Autoscaler", "PolicyContext", "register_policy", "autoscaling",
    "RankcoreError", "InvalidEvent", "InvalidConfig", "InvariantViolation", "shown",
    "RankConflict", "UnknownReplica", "UnknownDeployment", "RequestError", "Overloaded", "Unavailable",
    "RequestTimeout", "RequestCancelled", "ReplicaDied", "REQUEST_ERRORS",
    "ProxiesConfigured", "ProxyStarted", "ProxyCrashed", "ProxyHealthChecked", "NodeDraining",
    "ModelsReported", "ReplicaModels",
    "StartProxy", "DrainProxy", "StopProxy", "PROXY_STOP_REASONS", "ProxyLocation", "PROXY_LOCATIONS", "ProxyOptions",
    "ProxyPhase", "Proxy", "ProxyBook",
]
