"""The Python API: `scalerl.Trainer` (trainer.py) over the same training job as `scalerl train`; `scalerl.trl`
maps TRL's GRPOConfig and GRPOTrainer onto it."""
