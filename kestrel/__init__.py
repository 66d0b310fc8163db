"""
txkestrel: a durable, multi-protocol message queue server on Twisted.

It speaks Kestrel's memcache, thrift and text protocols and reads and writes
Kestrel's journal files byte for byte.
"""

__version__ = "1.1.0"
__all__ = ["__version__"]
