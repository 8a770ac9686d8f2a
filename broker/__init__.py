"""The phpmq-zmq broker: a pure core split into parts with one job each, a server loop and its
transports (docs/architecture.md).

Importing this package loads the codec (phpmq.protocol) and checks that its compiled modules,
if any (setup.py), match their sources; `phpmq.broker.shell.server` is the broker process,
`phpmq.broker.core` the core, `phpmq.broker.config` its settings.
"""

from ..protocol.compiled import check_compiled

check_compiled(__path__[0], __name__)
