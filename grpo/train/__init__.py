"""Training: the trainer (the loop) and its components: collection, the step's batch, the update,
forwards and splitting, the critic, knobs and controllers, the optimizer, run state."""


def __getattr__(name):  # `from grpo.train import Trainer` without importing the trainer for every submodule
    if name == "Trainer":
        from grpo.train.trainer import Trainer

        return Trainer
    raise AttributeError(name)
