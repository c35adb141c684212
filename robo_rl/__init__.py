"""robo_rl: offline pretraining from demonstrations, online fine-tuning with world-model search."""

__version__ = "0.1.0"
