"""The phpmq-zmq broker: a pure core split into parts with one job each, a server loop and its
transports (docs/architecture.md).

Importing this package loads nothing but this docstring: `phpmq.broker.shell.server` is the
broker process, `phpmq.broker.core` the core, `phpmq.broker.config` its settings.
"""
