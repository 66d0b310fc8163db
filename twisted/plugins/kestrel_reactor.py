"""
The reactor plugin C{kestrel}: Twisted's epoll reactor with a leaner dispatch.

C{twistd --reactor kestrel ...} runs any twistd application on it; the
C{kestrel} server uses it by default (see L{kestrel.reactor}).
"""

from twisted.application.reactors import Reactor

kestrel = Reactor(
    "kestrel", "kestrel.reactor",
    "epoll with a leaner dispatch of readable descriptors (txkestrel's default)")
