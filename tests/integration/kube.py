"""kmock's Kubernetes API emulator as the tests' API server (import it after `pytest.importorskip("kmock")`)."""

import itertools
import uuid
from types import SimpleNamespace

import kmock

from tests.integration.clouds import loopback_only


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator, filling in what an API server sets on each write: the resourceVersion (a watch resumes
    from the last one it saw; lightkube's reads it on every event), on creation a new uid, the namespace of the URL (a
    namespaced watch only streams objects that carry it) and a new Pod's phase, Pending."""

    versions = itertools.count(1)

    async def _handle(self, request):
        if (
            request.resource is not None
            and request.action in (kmock.action.CREATE, kmock.action.UPDATE)
            and isinstance(request.data, dict)
        ):
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(self.versions))
            if request.action == kmock.action.CREATE:
                meta["uid"] = str(uuid.uuid4())  # the server's, whatever the body says: a later Pod's differs
            if request.action == kmock.action.CREATE and request.namespace:
                meta.setdefault("namespace", request.namespace)
            if request.action == kmock.action.CREATE and request.resource.plural == "pods" and not request.subresource:
                request.data.setdefault("status", {}).setdefault("phase", "Pending")
        return await super()._handle(request)


class Served:
    """The emulator served on 127.0.0.1 with Pods and Secrets (`async with`: a SimpleNamespace of url, emulator)."""

    async def __aenter__(self) -> SimpleNamespace:
        self.emulator = Emulator()
        await self.emulator.__aenter__()
        self.server = kmock.Server(self.emulator)
        server = await self.server.__aenter__()
        self.emulator.resources["v1/pods"] = {}
        self.emulator.resources["v1/secrets"] = {}
        self.emulator.resources["networking.k8s.io/v1/networkpolicies"] = {}
        return SimpleNamespace(url=loopback_only(str(server.url).rstrip("/")), emulator=self.emulator)

    async def __aexit__(self, *exc) -> None:
        await self.server.__aexit__(*exc)
        await self.emulator.__aexit__(*exc)
