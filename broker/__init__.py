"""The phpmq-zmq broker: a pure core (queues, windows, TTL, redelivery) and a ZeroMQ shell."""

from .config import BrokerConfig, ConfigError, load_config
from .core import Core

__all__ = ["BrokerConfig", "ConfigError", "Core", "load_config"]
