"""The Kubernetes API wrapper's error contract (operator/kube.py): a failed call raises APIError and
nothing else, with status 0 when the API server did not answer; absence is an answer, not an error."""

from __future__ import annotations

import kopf
import pytest
from replication_operator import kube
from replication_operator.kube import APIError, APINotFoundError, KubeApi
from replication_operator.model import naming

from replicator.demo.local_nats import free_port
from tests.support.kube_emulator import OPERATOR_TOKEN, ClusterEmulator

NS = "contract"
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": NS}, "data": {}}


async def test_no_answer_is_status_0_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "BACKOFFS", (0.0, 0.0))
    api = KubeApi()
    api.use(kopf.ConnectionInfo(server=f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    try:
        with pytest.raises(APIError) as err:
            await api.get(naming.SECRET, NS, "s")
        assert type(err.value) is APIError and err.value.status == 0 and err.value.retryable
        assert "no answer from the API server" in kube.error_text(err.value)
        assert await api.get_quietly(naming.SECRET, NS, "s") is None  # logged, taken for absent
        with pytest.raises(APIError):
            await api.apply(SECRET)
    finally:
        await api.close()


async def test_before_login_every_call_is_status_0() -> None:
    with pytest.raises(APIError, match="not logged in") as err:
        await KubeApi().get(naming.SECRET, NS, "s")
    assert err.value.status == 0


async def test_answers_keep_their_status(cluster: ClusterEmulator) -> None:
    api = KubeApi()
    api.use(kopf.ConnectionInfo(server=str(cluster.url), insecure=True, token=OPERATOR_TOKEN))
    try:
        assert await api.get(naming.SECRET, NS, "s") is None
        assert await api.delete(naming.SECRET, NS, "s") is False
        with pytest.raises(APINotFoundError) as err:  # a status subresource of nothing
            await api.patch_status(naming.STREAM_REPLICATION, NS, "absent", {"lag": 1})
        assert err.value.status == 404 and not err.value.retryable
        created = await api.apply(SECRET)
        assert created["metadata"]["name"] == "s" and await api.get(naming.SECRET, NS, "s") is not None
        assert await api.delete(naming.SECRET, NS, "s") is True
    finally:
        await api.close()
