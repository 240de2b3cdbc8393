"""A second, independent gRPC client for the launcher: Python grpcio (gRPC's
C core), with stubs generated from the project's protos at run time.

Usage: cmd_client.py PROTO_ROOT SOCKET
Prints one JSON object with what each call returned, or the gRPC status
code and details of a call that failed.
"""

import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc


def generate(proto_root, out):
    for proto in ("cmd/v1/cmd.proto", "cmd/info/info.proto"):
        rc = protoc.main(
            [
                "protoc",
                f"-I{proto_root}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                proto,
            ]
        )
        if rc != 0:
            sys.exit(f"protoc failed on {proto}")
    # The generated modules import each other as packages.
    for d in ("cmd", "cmd/v1", "cmd/info"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)


def call(fn, request):
    try:
        return {"ok": fn(request, timeout=10)}
    except grpc.RpcError as e:
        return {"code": e.code().name, "details": e.details()}


def main():
    proto_root, socket = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp()
    generate(proto_root, out)
    from cmd.v1 import cmd_pb2, cmd_pb2_grpc
    from cmd.info import info_pb2, info_pb2_grpc

    # No authority override: the C core sends its default for a unix
    # target, the percent-encoded socket path.
    channel = grpc.insecure_channel(f"unix:{socket}")
    cmd = cmd_pb2_grpc.CmdStub(channel)
    info = info_pb2_grpc.CmdInfoStub(channel)
    empty = cmd_pb2.EmptyRequest()
    result = {"grpc_version": grpc.__version__}

    r = call(info.Info, info_pb2.CmdInfoRequest())
    result["Info"] = (
        {"versions": list(r["ok"].supportedCmdVersions)} if "ok" in r else r
    )
    r = call(cmd.Ping, empty)
    result["Ping"] = {"success": r["ok"].success} if "ok" in r else r
    r = call(cmd.GetDomain, empty)
    result["GetDomain"] = (
        {"success": r["ok"].response.success, "domain": r["ok"].domain}
        if "ok" in r
        else r
    )
    r = call(cmd.GetFilesystems, empty)
    result["GetFilesystems"] = (
        {
            "success": r["ok"].response.success,
            "list": r["ok"].guestFilesystemsResponse,
        }
        if "ok" in r
        else r
    )
    r = call(cmd.GetQemuVersion, empty)
    result["GetQemuVersion"] = {"ok": True} if "ok" in r else r
    print(json.dumps(result))


if __name__ == "__main__":
    main()
