"""tfcluster: TensorFlow distributed training on bare-metal machines."""

__version__ = "0.2.0"
