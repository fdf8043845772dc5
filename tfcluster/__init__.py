"""tfcluster: TensorFlow distributed training on bare-metal machines."""

__version__ = "0.8.0"
