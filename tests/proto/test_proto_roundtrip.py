"""Round trips of every message type through both codecs, and the rules that are not round trips:
v3's status precedence, unsupported operations, v2's limits, matching keys."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError
from quorumlog.proto import messages as m
from quorumlog.proto import v2, v3
from quorumlog.proto.codec import ClientConnection, ServerConnection
from quorumlog.proto.generated import bookkeeper_pb2 as pb
from quorumlog.proto.status import StatusCode

from .strategies import V2_REQUESTS, V2_RESPONSES, V3_REQUESTS, V3_RESPONSES


def test_strategies_cover_every_message_type() -> None:
    assert set(V3_REQUESTS) == set(m.REQUEST_TYPES)
    assert set(V3_RESPONSES) == set(m.RESPONSE_TYPES)
    # DESIGN.md §1: 4.14 serves exactly ADD, READ and AUTH over v2.
    assert set(V2_REQUESTS) == {m.AddRequest, m.ReadRequest, m.AuthRequest}
    assert set(V2_RESPONSES) == {m.AddResponse, m.ReadResponse, m.AuthResponse}


def _body(frame: bytes) -> bytes:
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    return frame[4:]


@pytest.mark.parametrize("cls", list(V3_REQUESTS), ids=lambda c: c.__name__)
@given(data=st.data())
def test_v3_request_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(V3_REQUESTS[cls])
    frame = v3.encode_request(msg)
    assert v3.decode_request(_body(frame)) == msg
    assert v3.decode_request_pb(_body(frame)) == msg
    assert v3.encode_request_pb(msg) == frame  # fast path (where there is one) == protobuf reference


@pytest.mark.parametrize("cls", list(V3_RESPONSES), ids=lambda c: c.__name__)
@given(data=st.data())
def test_v3_response_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(V3_RESPONSES[cls])
    frame = v3.encode_response(msg)
    assert v3.decode_response(_body(frame)) == msg
    assert v3.decode_response_pb(_body(frame)) == msg
    assert v3.encode_response_pb(msg) == frame


@pytest.mark.parametrize("cls", list(V2_REQUESTS), ids=lambda c: c.__name__)
@given(data=st.data())
def test_v2_request_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(V2_REQUESTS[cls])
    assert v2.decode_request(_body(v2.encode_request(msg))) == msg


@pytest.mark.parametrize("cls", list(V2_RESPONSES), ids=lambda c: c.__name__)
@given(data=st.data())
def test_v2_response_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(V2_RESPONSES[cls])
    assert v2.decode_response(_body(v2.encode_response(msg))) == msg


@given(st.sampled_from(list(StatusCode)), st.integers(0, 2**63 - 1))
def test_status_codes_sent_to_a_4_14_peer_are_ones_it_knows(status: StatusCode, ledger: int) -> None:
    expected = StatusCode.EIO if status is StatusCode.EUNKNOWNLEDGERSTATE else status
    v3_resp = v3.decode_response(_body(v3.encode_response(m.AddResponse(status, ledger, 1))))
    v2_resp = v2.decode_response(_body(v2.encode_response(m.AddResponse(status, ledger, 1))))
    assert v3_resp.status is expected
    assert v2_resp.status is expected


def test_v2_rc_numbers_are_bookkeepers() -> None:
    frame = v2.encode_response(m.AddResponse(StatusCode.EFENCED, 25, 5))
    assert frame.hex() == "00000018020100000000006800000000000000190000000000000005"  # captured seq 380
    assert (
        v2.decode_response(bytes.fromhex("0201000000000065" + "00" * 16)).status is StatusCode.EIO
    )  # rc 101
    # An rc we do not know is the peer failing in a way we can't name: EIO.
    assert v2.decode_response(bytes.fromhex("02010000000003e7" + "00" * 16)).status is StatusCode.EIO


def _response(status: int, inner: int | None, op: int = pb.ADD_ENTRY) -> bytes:
    r = pb.Response(status=status)  # type: ignore[arg-type]
    r.header.version, r.header.operation, r.header.txnId = pb.VERSION_THREE, op, 9  # type: ignore[assignment]
    if inner is not None:
        r.addResponse.status, r.addResponse.ledgerId, r.addResponse.entryId = inner, 1, 2  # type: ignore[assignment]
    return r.SerializeToString()


def test_v3_status_precedence_follows_bookkeepers_client() -> None:
    # A failed top-level status wins; otherwise the operation's own status is the answer.
    assert v3.decode_response(_response(pb.EBADREQ, pb.EOK)).status is StatusCode.EBADREQ
    assert v3.decode_response(_response(pb.EOK, pb.EFENCED)).status is StatusCode.EFENCED
    assert v3.decode_response(_response(pb.EBADREQ, None)) == m.ErrorResponse(
        m.OpCode.ADD_ENTRY, StatusCode.EBADREQ, 9
    )


@pytest.mark.parametrize("op", [pb.RANGE_READ_ENTRY, pb.RANGE_ADD_ENTRY, pb.BATCH_READ_ENTRY, pb.ADD_ENTRY])
def test_unserved_v3_operations_decode_to_unsupported_request_and_get_ebadreq(op: int) -> None:
    req = pb.Request()
    req.header.version, req.header.operation, req.header.txnId = pb.VERSION_THREE, op, 77  # type: ignore[assignment]
    server = ServerConnection()
    (decoded,) = server.receive(len(req.SerializeToString()).to_bytes(4, "big") + req.SerializeToString())
    assert decoded == m.UnsupportedRequest(op, 77)
    answer = server.send(m.ErrorResponse(op, StatusCode.EBADREQ, 77))
    client = ClientConnection(m.ProtocolVersion.V3)
    (resp,) = client.receive(answer)
    assert resp == m.ErrorResponse(op, StatusCode.EBADREQ, 77)
    assert client.key(resp) == client.key(decoded) == 77
    with pytest.raises(InvalidArgumentError):
        v3.encode_request(decoded)


@pytest.mark.parametrize(
    "req",
    [
        m.ReadLacRequest(1),
        m.WriteLacRequest(1, 2, b"k" * 20, b"b"),
        m.GetBookieInfoRequest(),
        m.ForceLedgerRequest(1),
        m.GetListOfEntriesOfLedgerRequest(1),
        m.StartTLSRequest(),
        m.ReadRequest(1, -1, piggyback=True, previous_lac=1, timeout_ms=10),
        m.ReadRequest(1, -1, fence=True),  # fencing needs the master key
        m.AddRequest(1, 2, b"k" * 20, b"x" * 32, write_flags=m.WRITE_FLAG_DEFERRED_SYNC),
        m.AddRequest(1, 2, b"short", b"x" * 32),
    ],
    ids=repr,
)
def test_what_v2_cannot_express_is_refused_when_encoding(req: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        v2.encode_request(req)


def test_v3_read_cannot_be_both_fencing_and_long_poll() -> None:
    with pytest.raises(InvalidArgumentError):
        v3.encode_request(m.ReadRequest(1, 1, fence=True, piggyback=True))


@pytest.mark.parametrize(
    ("request_", "response"),
    [
        (m.AddRequest(3, 4, b"k" * 20, b"e" * 40), m.AddResponse(StatusCode.EOK, 3, 4)),
        (
            m.ReadRequest(3, -1, fence=True, master_key=b"k" * 20),
            m.ReadResponse(StatusCode.EOK, 3, -1, b"e" * 40),
        ),
        (m.ReadRequest(3, 7), m.ReadResponse(StatusCode.ENOENTRY, 3, 7)),
        (m.AuthRequest("plugin", b"hi"), m.AuthResponse(StatusCode.EOK, "plugin", b"ok")),
    ],
)
def test_v2_responses_match_their_requests_by_op_ledger_entry(request_: Any, response: Any) -> None:
    assert v2.match_key(request_) == v2.match_key(response)
    other = m.AddResponse(StatusCode.EOK, 3, 5)
    assert v2.match_key(other) != v2.match_key(response)


def test_server_answers_in_the_version_the_client_spoke() -> None:
    for version in m.ProtocolVersion:
        client = ClientConnection(version)
        server = ServerConnection()
        with pytest.raises(InvalidArgumentError):
            server.send(m.AddResponse(StatusCode.EOK, 1, 2))  # version unknown before the first request
        req = m.AddRequest(
            1, 2, b"k" * 20, (1).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"e" * 30, txn_id=5
        )
        (got,) = server.receive(client.send(req))
        assert server.version is version
        (resp,) = client.receive(server.send(m.AddResponse(StatusCode.EOK, 1, 2, txn_id=got.txn_id)))
        assert client.key(resp) == client.key(req)


@pytest.mark.parametrize(
    "cls", [*m.REQUEST_TYPES, *m.RESPONSE_TYPES, m.UnsupportedRequest], ids=lambda c: c.__name__
)
def test_messages_are_frozen_and_keep_the_dataclass_signature(cls: type) -> None:
    """The faster generated __init__ (proto/_fastinit.py) must behave like the dataclass one."""
    import dataclasses
    import inspect

    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]
    args = {f.name: i for i, f in enumerate(fields)}
    msg = cls(**args)
    assert msg == cls(*args.values())
    assert [getattr(msg, f.name) for f in fields] == list(args.values())
    hash(msg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.txn_id = 1  # type: ignore[misc]


_BAD_INTS = st.sampled_from([2**63, 2**64, -(2**63) - 1, 2**70, -1])


@given(_BAD_INTS, st.sampled_from(["ledger_id", "entry_id", "txn_id", "priority", "write_flags"]))
def test_out_of_range_values_are_refused_alike_by_every_encoder(bad: int, field: str) -> None:
    """The hand-written v3 encoders refuse exactly what protobuf refuses (and v2 refuses what it cannot
    pack), always as InvalidArgumentError -- never a struct.error or a silently wrapped varint."""
    import dataclasses

    limits = {"txn_id": (0, 2**64), "priority": (0, 2**32), "write_flags": (-(2**31), 2**31)}
    lo, hi = limits.get(field, (-(2**63), 2**63))
    add = dataclasses.replace(m.AddRequest(1, 2, b"k" * 20, b"e" * 40), **{field: bad})
    encoders = [v3.encode_request, v3.encode_request_pb]
    if lo <= bad < hi:
        assert v3.encode_request(add) == v3.encode_request_pb(add)
    else:
        for encode in encoders:
            with pytest.raises(InvalidArgumentError):
                encode(add)
    if field in ("ledger_id", "entry_id", "txn_id"):
        resps = [
            dataclasses.replace(m.AddResponse(StatusCode.EOK, 1, 2), **{field: bad}),
            dataclasses.replace(m.ReadResponse(StatusCode.EOK, 1, 2, b"e"), **{field: bad}),
        ]
        for resp in resps:
            if lo <= bad < hi:
                assert v3.encode_response(resp) == v3.encode_response_pb(resp)
            else:
                for encode_r in (v3.encode_response, v3.encode_response_pb):
                    with pytest.raises(InvalidArgumentError):
                        encode_r(resp)
            if field != "txn_id" and not lo <= bad < hi:
                with pytest.raises(InvalidArgumentError):
                    v2.encode_response(resp)


def test_v2_client_negotiates_tls_with_one_v3_exchange_then_speaks_v2() -> None:
    """BookKeeper's v2 client with TLS sends START_TLS as v3 on its v2 connection, then continues in v2;
    the bookie must follow (v3 until the first non-v3 frame)."""
    client = ClientConnection(m.ProtocolVersion.V2)
    server = ServerConnection()
    tls = m.StartTLSRequest(txn_id=1)
    (got,) = server.receive(client.send(tls))
    assert got == tls
    assert server.version is m.ProtocolVersion.V3
    (answer,) = client.receive(server.send(m.StartTLSResponse(StatusCode.EOK, 1)))
    assert client.key(answer) == client.key(tls)
    add = m.AddRequest(1, 2, b"k" * 20, (1).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"e" * 30)
    (got,) = server.receive(client.send(add))
    assert got == add and server.version is m.ProtocolVersion.V2
    frame = server.send(m.AddResponse(StatusCode.EOK, 1, 2))
    assert frame[4] == 2  # a v2 frame
    (resp,) = client.receive(frame)
    assert client.key(resp) == client.key(add)
