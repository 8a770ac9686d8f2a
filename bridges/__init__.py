"""Bridges between the broker and existing ZeroMQ tools (`phpmq bridge ...`), each an
ordinary client of the broker in a process of its own: pull-in, sub-in, push-out, req-out,
pub-out. The raw-TCP endpoint for stock PHPMQ clients lives in the broker (broker/tcp.py)."""
