"""The twistd plugin C{kestrel}: the real work is in L{kestrel.tap}."""

from twisted.application.service import ServiceMaker

kestrel = ServiceMaker("txkestrel", "kestrel.tap", "Kestrel-compatible message queue server",
                       "kestrel")
