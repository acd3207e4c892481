"""The exceptions users see: a problem with what they asked for (and how to fix it), and a run
stopped on a signal."""

import signal


class ScaleRLError(Exception):
    """A user-facing error: the CLI prints `str(err)` on one line and exits with code 2.

    The message names the field, file or name at fault and says what to do instead.
    """


class RewardsFailing(ScaleRLError):
    """A reward component (or the environment's score) failed on too many items (reward.failures); the training job
    checkpoints the last finished step, records a critical health event and stops with this one line."""

    def __init__(self, message: str, component: str = "", share: float = 0.0):
        super().__init__(message)
        self.component, self.share = component, share


class Stopped(Exception):
    """The run stopped on a signal (SIGTERM, SIGINT) after `step`, its checkpoint written (`checkpoint`:
    its folder; None when no step had run). `scalerl/trainer/signals.py` raises it."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        saved = f"checkpoint saved at {checkpoint}" if checkpoint else "no step had run, nothing to save"
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; {saved}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
