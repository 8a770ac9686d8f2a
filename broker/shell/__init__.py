"""The broker's shell: everything that touches sockets, files, signals or the clock (the
server loop, the transports, the durable store, security, metrics, the shard supervisor).
The pure core (the modules of `phpmq.broker`) never imports it (tests/test_layout.py)."""
