"""What rl/trainer's packages may build on outside the trainer: the backends, rl/core and the tasks."""

TRAINER_EXTERNAL_DEPS = [
    "//rl/backends",
    "//rl/backends/planner",
    "//rl/core:images",
    "//rl/core:model_class",
    "//rl/core:processors",
    "//rl/core:sandbox",
    "//rl/core/algorithms",
    "//rl/core/config",
    "//rl/core/data",
    "//rl/core/environments",
    "//rl/core/generation",
    "//rl/core/packing",
    "//rl/core/rewards",
    "//rl/tasks:environments",
    "//rl/tasks:jobs",
    "//rl/tasks:rewards",
    "//rl/tasks/embedded",
    "//rl/tasks/embedded_vl",
]
