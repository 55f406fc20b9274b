"""The Open Inference Protocol (inference.GRPCInferenceService) against the
real dgmm-server over loopback, from a plain grpcio client built from
proto/inference: every call a tritonclient.grpc user makes (ServerLive,
ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelInfer) and
Triton's ModelConfig, ModelInfer for sides right, left and both in FP32,
FP64, FP16 and BF16 (bit patterns handled here, without ml_dtypes), raw and
typed contents, mixed datatypes, and the errors: unknown model or version,
wrong shapes, a missing input, complex and other datatypes refused, a
message over the server's limit, a wrong or missing token, a deadline that
passes while the job waits in admission behind a held stream.

Results are checked element by element against a float64 reference
computed here with NumPy from fresh random operands: one-sided half-type
results bit for bit (the product of two half values is exact, then rounded
once), the others within their roundings.

Run by ctest (python_oip), or by hand after building dgmm-server and
dgmm_oip_python:
  DGMM_SERVER_BIN=build/service/dgmm-server DGMM_OIP_PY=build/oip_python \\
    /usr/bin/python3 tests/python/test_oip.py -v
"""

import os
import sys
import tempfile
import threading
import time
import unittest

if __name__ == "__main__":
    try:
        import grpc  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as missing:
        print("SKIP: %s lacks a client dependency (%s)" % (sys.executable, missing))
        sys.exit(77)

import grpc  # noqa: E402
import numpy as np  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
sys.path.insert(0, os.environ.get("DGMM_OIP_PY", os.path.join(REPO, "build", "oip_python")))
from dgmm_server import ServerProcess  # noqa: E402
from inference import grpc_predict_v2_pb2 as pb  # noqa: E402
from inference import grpc_predict_v2_pb2_grpc as pb_grpc  # noqa: E402
from inference import model_config_pb2 as config_pb  # noqa: E402
import dgmm_pb2  # noqa: E402  (dgmm.proto from plain grpcio: proto/CMakeLists.txt)
import dgmm_pb2_grpc  # noqa: E402

SERVER = None
RNG = np.random.default_rng()


def setUpModule():
    global SERVER
    SERVER = ServerProcess(flags=["--threads=2"], prefix="dgmm-py-oip-")


def tearDownModule():
    if SERVER:
        SERVER.stop()


def stub_for(address):
    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
    return channel, pb_grpc.GRPCInferenceServiceStub(channel)


# ------------------------------------------------------------ half types by hand

def bf16_bits(x32):
    """float32 -> bfloat16 bit patterns, rounded to nearest, ties to even."""
    u = np.asarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f64(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32) \
        .astype(np.float64)


class Operand:
    """A tensor of an OIP datatype: its raw little-endian bytes and its
    values as float64."""

    def __init__(self, datatype, shape):
        values = RNG.uniform(0.5, 2.0, size=shape) * RNG.choice([-1.0, 1.0], size=shape)
        self.datatype = datatype
        self.shape = list(shape)
        if datatype == "BF16":
            bits = bf16_bits(values.astype(np.float32))
            self.raw = bits.tobytes()
            self.f64 = bf16_to_f64(bits)
        else:
            typed = values.astype({"FP16": np.float16, "FP32": np.float32,
                                   "FP64": np.float64}[datatype])
            self.raw = typed.tobytes()
            self.typed = typed
            self.f64 = typed.astype(np.float64)


def decode(datatype, raw, shape):
    """float64 values and bit patterns of a raw output."""
    if datatype == "BF16":
        bits = np.frombuffer(raw, dtype=np.uint16)
        return bf16_to_f64(bits).reshape(shape), bits.reshape(shape)
    dt = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    values = np.frombuffer(raw, dtype=dt)
    return values.astype(np.float64).reshape(shape), values.reshape(shape)


def round_to(datatype, x64):
    """The float64 values `x64` rounded once to `datatype`: bit patterns."""
    if datatype == "BF16":
        return bf16_bits(x64.astype(np.float32))  # exact products: float32 loses nothing
    return x64.astype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype])


def infer_request(side, inputs, request_id="", typed=False):
    req = pb.ModelInferRequest(model_name="dgmm", id=request_id)
    if side is not None:
        req.parameters["side"].string_param = side
    for name, op in inputs:
        t = req.inputs.add(name=name, datatype=op.datatype, shape=op.shape)
        if typed:
            field = {"FP32": t.contents.fp32_contents, "FP64": t.contents.fp64_contents}[op.datatype]
            field.extend(op.typed.ravel().tolist())
        else:
            req.raw_input_contents.append(op.raw)
    return req


def result_datatype(a, d):
    if a == d:
        return a
    if "FP64" in (a, d):
        return "FP64"
    return "FP32"


class OipCalls(unittest.TestCase):
    def setUp(self):
        self.channel, self.stub = stub_for(SERVER.address)

    def tearDown(self):
        self.channel.close()

    def assertCode(self, code, call, *args, contains=(), **kwargs):
        with self.assertRaises(grpc.RpcError) as caught:
            call(*args, **kwargs)
        self.assertEqual(caught.exception.code(), code, caught.exception.details())
        for text in contains:
            self.assertIn(text, caught.exception.details())
        return caught.exception

    def test_server_live_ready_metadata(self):
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.stub.ServerReady(pb.ServerReadyRequest()).ready)
        meta = self.stub.ServerMetadata(pb.ServerMetadataRequest())
        self.assertEqual(meta.name, "dgmm")
        self.assertTrue(meta.version)
        self.assertEqual(list(meta.extensions), [])

    def test_model_ready(self):
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="dgmm")).ready)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="dgmm", version="1")).ready)
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="resnet")).ready)
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="dgmm", version="2")).ready)

    def test_model_metadata(self):
        m = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="dgmm"))
        self.assertEqual((m.name, list(m.versions), m.platform), ("dgmm", ["1"], "dgmm"))
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.inputs],
                         [("A", "FP32", [-1, -1]), ("d", "FP32", [-1])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.outputs],
                         [("C", "FP32", [-1, -1])])
        self.assertCode(grpc.StatusCode.NOT_FOUND, self.stub.ModelMetadata,
                        pb.ModelMetadataRequest(name="resnet"), contains=["'resnet'"])
        self.assertCode(grpc.StatusCode.NOT_FOUND, self.stub.ModelMetadata,
                        pb.ModelMetadataRequest(name="dgmm", version="7"))

    def test_model_config(self):
        call = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelConfig",
            request_serializer=config_pb.ModelConfigRequest.SerializeToString,
            response_deserializer=config_pb.ModelConfigResponse.FromString)
        c = call(config_pb.ModelConfigRequest(name="dgmm")).config
        self.assertEqual((c.name, c.backend, c.max_batch_size), ("dgmm", "dgmm", 0))
        self.assertEqual([(i.name, list(i.dims), i.optional) for i in c.input],
                         [("A", [-1, -1], False), ("d", [-1], False), ("l", [-1], True),
                          ("r", [-1], True)])
        self.assertEqual([(o.name, o.data_type) for o in c.output], [("C", config_pb.TYPE_FP32)])
        self.assertCode(grpc.StatusCode.NOT_FOUND, call, config_pb.ModelConfigRequest(name="x"))

    def check_infer(self, side, a_type, d_type, rows, cols, typed=False):
        a = Operand(a_type, (rows, cols))
        if side == "both":
            l, r = Operand(d_type, (rows,)), Operand(d_type, (cols,))
            inputs = [("A", a), ("l", l), ("r", r)]
            ref = l.f64[:, None] * a.f64 * r.f64
        else:
            d = Operand(d_type, (cols if side == "right" else rows,))
            inputs = [("A", a), ("d", d)]
            ref = a.f64 * d.f64 if side == "right" else d.f64[:, None] * a.f64
        request_id = "job-%d" % RNG.integers(1 << 30)
        # side "right" is the default: also sent without the parameter.
        req = infer_request(None if side == "right" and rows % 2 else side, inputs, request_id,
                            typed=typed)
        resp = self.stub.ModelInfer(req, timeout=60)
        c_type = result_datatype(a_type, d_type)
        self.assertEqual((resp.model_name, resp.model_version, resp.id),
                         ("dgmm", "1", request_id))
        self.assertEqual([(o.name, o.datatype, list(o.shape)) for o in resp.outputs],
                         [("C", c_type, [rows, cols])])
        self.assertEqual(len(resp.raw_output_contents), 1)
        raw = resp.raw_output_contents[0]
        size = {"FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8}[c_type]
        self.assertEqual(len(raw), rows * cols * size)
        got, bits = decode(c_type, raw, (rows, cols))
        label = "%s %s x %s -> %s %dx%d" % (side, a_type, d_type, c_type, rows, cols)
        if side != "both" and (c_type in ("FP16", "BF16") or c_type == result_datatype(a_type, a_type)
                               and a_type == d_type):
            # One product of two values of the type, rounded once: bit for bit.
            want = round_to(c_type, ref)
            self.assertTrue(np.array_equal(bits.view(np.uint8), np.asarray(want).view(np.uint8)),
                            label)
        else:
            eps = {"FP16": 2.0 ** -10, "BF16": 2.0 ** -7, "FP32": 2.0 ** -23,
                   "FP64": 2.0 ** -52}[c_type]
            rel = np.abs(got - ref) / np.abs(ref)
            self.assertLessEqual(rel.max(), 2.01 * eps, label)

    def test_infer_every_side_and_datatype(self):
        for side in ("right", "left", "both"):
            for t in ("FP32", "FP64", "FP16", "BF16"):
                rows, cols = int(RNG.integers(1, 70)), int(RNG.integers(1, 70))
                with self.subTest(side=side, datatype=t):
                    self.check_infer(side, t, t, rows, cols)

    def test_infer_mixed_datatypes(self):
        for a, d in (("FP32", "FP64"), ("FP64", "FP32"), ("FP16", "BF16"), ("FP16", "FP32"),
                     ("BF16", "FP64")):
            with self.subTest(a=a, d=d):
                self.check_infer("right", a, d, 13, 29)
                self.check_infer("both", a, d, 7, 5)

    def test_infer_typed_contents(self):
        for t in ("FP32", "FP64"):
            for side in ("right", "left", "both"):
                with self.subTest(datatype=t, side=side):
                    self.check_infer(side, t, t, 11, 17, typed=True)

    def test_infer_large_job(self):
        # Many slices on the wire each way (the result goes out from its buffer).
        self.check_infer("right", "FP32", "FP32", 1000, 1000)

    def test_infer_counts_as_a_dgmm_job(self):
        info = dgmm_pb2_grpc.DgmmStub(self.channel)
        done = lambda: sum(d.completed_jobs for d in  # noqa: E731
                           info.GetServerInfo(dgmm_pb2.GetServerInfoRequest()).devices)
        before = done()
        self.check_infer("left", "FP32", "FP32", 3, 4)
        self.assertEqual(done(), before + 1)

    def test_errors(self):
        a, d = Operand("FP32", (3, 4)), Operand("FP32", (4,))
        invalid = grpc.StatusCode.INVALID_ARGUMENT

        def infer(req):
            return self.stub.ModelInfer(req, timeout=30)

        req = infer_request("right", [("A", a), ("d", d)])
        req.model_name = "resnet"
        self.assertCode(grpc.StatusCode.NOT_FOUND, infer, req, contains=["'resnet'"])
        req = infer_request("right", [("A", a), ("d", d)])
        req.model_version = "3"
        self.assertCode(grpc.StatusCode.NOT_FOUND, infer, req)
        # d of A's row count for side right.
        self.assertCode(invalid, infer, infer_request("right", [("A", a), ("d", Operand("FP32", (3,)))]),
                        contains=["'d'", "[4]"])
        self.assertCode(invalid, infer, infer_request("right", [("A", Operand("FP32", (2, 3, 4))),
                                                                ("d", d)]), contains=["'A'"])
        self.assertCode(invalid, infer, infer_request("right", [("A", a)]),
                        contains=["missing input 'd'"])
        self.assertCode(invalid, infer, infer_request("both", [("A", a), ("d", d)]),
                        contains=["unexpected input 'd'"])
        req = infer_request("right", [("A", a), ("d", d)])
        req.raw_input_contents[0] = req.raw_input_contents[0][:-4]
        self.assertCode(invalid, infer, req, contains=["'A'", "bytes"])
        req = infer_request("right", [("A", a), ("d", d)])
        req.inputs[0].datatype = "COMPLEX64"
        self.assertCode(invalid, infer, req, contains=["complex", "dgmm.v1.Dgmm"])
        req.inputs[0].datatype = "INT32"
        self.assertCode(invalid, infer, req, contains=["INT32"])
        req = infer_request("up", [("A", a), ("d", d)])
        self.assertCode(invalid, infer, req, contains=["'side'"])
        req = infer_request("right", [("A", a), ("d", d)])
        req.outputs.add(name="D")
        self.assertCode(invalid, infer, req, contains=["'D'"])
        req = infer_request("right", [("A", a), ("d", d)])
        req.inputs[0].parameters["shared_memory_region"].string_param = "x"
        self.assertCode(invalid, infer, req, contains=["shared memory"])
        # Requests that fail still leave the server serving.
        self.check_infer("right", "FP32", "FP32", 3, 4)


class OipLimits(unittest.TestCase):
    def test_message_over_the_unary_limit_names_the_streaming_api(self):
        server = ServerProcess(flags=["--threads=2", "--max_unary_message_bytes=1MiB"],
                               prefix="dgmm-py-oip-limit-")
        try:
            channel, stub = stub_for(server.address)
            a, d = Operand("FP32", (600, 600)), Operand("FP32", (600,))
            with self.assertRaises(grpc.RpcError) as caught:
                stub.ModelInfer(infer_request("right", [("A", a), ("d", d)]), timeout=30)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("MultiplyStream", caught.exception.details())
            self.assertIn("ModelInfer request", caught.exception.details())
            channel.close()
        finally:
            server.stop()

    def test_deadline_passing_in_admission(self):
        # 64 KiB blocks: a streamed job holds 512 KiB and a little; a unary
        # 200x200 float32 job 2 * 160000 + 800 bytes; 560 KiB holds one.
        server = ServerProcess(flags=["--max_block_bytes=64KiB", "--host_memory_budget=560KiB"],
                               prefix="dgmm-py-oip-deadline-")
        try:
            channel, stub = stub_for(server.address)
            dgmm = dgmm_pb2_grpc.DgmmStub(channel)
            header = dgmm_pb2.JobHeader(rows=4, cols=4, dtype=dgmm_pb2.DTYPE_FLOAT32,
                                        diagonal=np.ones(4, np.float32).tobytes())
            sent = threading.Event()

            def requests():
                yield dgmm_pb2.MultiplyStreamRequest(header=header)
                sent.wait()  # holds its reservation until released
            held = dgmm.MultiplyStream(requests())
            self.assertTrue(next(held).HasField("accepted"))

            def info():
                return dgmm.GetServerInfo(dgmm_pb2.GetServerInfoRequest()).devices

            a, d = Operand("FP32", (200, 200)), Operand("FP32", (200,))
            future = stub.ModelInfer.future(infer_request("right", [("A", a), ("d", d)]),
                                            timeout=3)
            deadline = time.monotonic() + 30
            while sum(x.queued_jobs for x in info()) != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(sum(x.queued_jobs for x in info()), 1)
            with self.assertRaises(grpc.RpcError) as caught:
                future.result()
            self.assertEqual(caught.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            while (sum(x.rejected_jobs["deadline"] for x in info()) != 1
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            self.assertEqual(sum(x.rejected_jobs["deadline"] for x in info()), 1)
            self.assertEqual(sum(x.queued_jobs for x in info()), 0)
            held.cancel()
            sent.set()
            channel.close()
        finally:
            server.stop()


class OipAuth(unittest.TestCase):
    def test_token(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "token")
            token = "oip-token-%d" % RNG.integers(1 << 40)
            with open(path, "w") as f:
                f.write(token + "\n")
            server = ServerProcess(flags=["--threads=2", "--auth_token_file=" + path],
                                   prefix="dgmm-py-oip-auth-")
            try:
                channel, stub = stub_for(server.address)
                a, d_ = Operand("FP32", (5, 6)), Operand("FP32", (6,))
                req = infer_request("right", [("A", a), ("d", d_)])
                for metadata in ((), (("authorization", "Bearer wrong"),)):
                    with self.assertRaises(grpc.RpcError) as caught:
                        stub.ModelInfer(req, metadata=metadata, timeout=30)
                    self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                    with self.assertRaises(grpc.RpcError) as caught:
                        stub.ModelMetadata(pb.ModelMetadataRequest(name="dgmm"), metadata=metadata)
                    self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                # Probes stay open, as grpc.health.v1 does.
                self.assertTrue(stub.ServerLive(pb.ServerLiveRequest()).live)
                self.assertTrue(stub.ServerReady(pb.ServerReadyRequest()).ready)
                good = (("authorization", "Bearer " + token),)
                resp = stub.ModelInfer(req, metadata=good, timeout=30)
                got = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(5, 6)
                self.assertTrue(np.array_equal(got, (a.f64 * d_.f64).astype(np.float32)))
                channel.close()
            finally:
                server.stop()


if __name__ == "__main__":
    unittest.main()
