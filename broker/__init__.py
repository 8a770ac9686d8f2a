"""The phpmq-zmq broker: a pure core (queues, windows, TTL, redelivery) and a ZeroMQ shell."""

from broker.config import BrokerConfig, ConfigError, load_config
from broker.core import Core

__all__ = ["BrokerConfig", "ConfigError", "Core", "load_config"]
