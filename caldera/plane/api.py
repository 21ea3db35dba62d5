"""Protocol v1 endpoint handlers, answering as ClawManager's server does (clawmanager-notes section 1).

A handler takes a `Request` and the `Plane` (store + settings) and returns a
`Response`. Order of checks per call: bearer token (401), session (401), body
(400 with the schema's reason), agent id (403), then the resource (404).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any

from caldera.plane import store as st
from caldera.plane import upload
from caldera.plane.validation import BodyError, check, parse_json_body, parse_time

FINISH_STATUSES = ("succeeded", "failed")


@dataclasses.dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    client_ip: str | None = None
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    query: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json; charset=utf-8"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Plane:
    store: st.Store
    heartbeat_interval: int = 15
    poll_interval: int = 5
    collect_skill_packages: bool = True


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def rfc3339(ts: float) -> str:
    """Go's RFC3339Nano in UTC: fractional digits without trailing zeros."""
    when = dt.datetime.fromtimestamp(ts, dt.UTC)
    frac = f"{when.microsecond:06d}".rstrip("0")
    return when.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def ok(data: Any = None, message: str = "ok", status: int = 200, raw_data: str | None = None) -> Response:
    """The success envelope; `raw_data` is inserted verbatim (for bytes that must survive as sent)."""
    if raw_data is None:
        text = json.dumps({"success": True, "message": message, "data": data}, separators=(",", ":"))
    else:
        text = f'{{"success":true,"message":{json.dumps(message)},"data":{raw_data}}}'
    return Response(status, text.encode())


def error(status: int, message: str) -> Response:
    return Response(status, json.dumps({"success": False, "error": message}, separators=(",", ":")).encode())


def bearer(req: Request) -> str | None:
    value = req.headers.get("authorization", "")
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _session(plane: Plane, req: Request) -> dict[str, Any]:
    token = bearer(req)
    if token is None:
        raise ApiError(401, "Agent session token is required")
    session = plane.store.session(token)
    if session is None:
        raise ApiError(401, "invalid or expired agent session token")
    return session


def _body(req: Request, schema: str) -> dict[str, Any]:
    try:
        doc = parse_json_body(req.body)
        check(schema, doc)
    except BodyError as exc:
        raise ApiError(400, str(exc)) from None
    return doc


def _time(doc: dict[str, Any], field: str) -> float | None:
    try:
        return parse_time(doc.get(field), field)
    except BodyError as exc:
        raise ApiError(400, str(exc)) from None


def _same_agent(session: dict[str, Any], agent_id: str, trim: bool = True,
                text: str = "agent id does not match session") -> None:
    given = agent_id.strip() if trim else agent_id
    if given != session["agent_id"]:
        raise ApiError(403, text)


def _command_id(req: Request) -> int:
    raw = req.params["id"]
    if not re.fullmatch(r"[0-9]+", raw):
        raise ApiError(400, "Invalid command ID")
    return int(raw)


# ---- endpoints ----------------------------------------------------------------------

def register(plane: Plane, req: Request) -> Response:
    token = bearer(req)
    if token is None:
        raise ApiError(401, "Agent bootstrap token is required")
    body = _body(req, "register.schema.json")
    if body["protocol_version"].strip() != "v1":
        raise ApiError(400, "unsupported agent protocol version")
    instance_id = plane.store.instance_for_token(token)
    if instance_id is None or instance_id != body["instance_id"]:
        raise ApiError(400, "invalid agent bootstrap token")
    session = plane.store.register(instance_id, body, req.client_ip)
    return ok({"session_token": session["session_token"],
               "session_expires_at": rfc3339(session["session_expires_at"]),
               "heartbeat_interval_seconds": plane.heartbeat_interval,
               "command_poll_interval_seconds": plane.poll_interval,
               "server_time": rfc3339(session["server_time"])}, "agent registered")


def heartbeat(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    body = _body(req, "heartbeat.schema.json")
    _same_agent(session, body["agent_id"])
    _time(body, "timestamp")
    answer = plane.store.heartbeat(session["instance_id"], body)
    answer["server_time"] = rfc3339(answer["server_time"])
    return ok(answer, "heartbeat accepted")


def state_report(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    body = _body(req, "state-report.schema.json")
    _same_agent(session, body["agent_id"])
    reported_at = _time(body, "reported_at")
    plane.store.state_report(session["instance_id"], body, reported_at)
    return ok(None, "state reported")


def next_command(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    command = plane.store.next_command(session["instance_id"], session["agent_id"])
    if command is not None:
        command["issued_at"] = rfc3339(command["issued_at"])
    return ok({"command": command}, "next command")


def start_command(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    command_id = _command_id(req)
    body = _body(req, "command-start.schema.json")
    # The real handler compares untrimmed, with its own capitalisation.
    _same_agent(session, body["agent_id"], trim=False, text="Agent ID does not match session")
    started = _time(body, "started_at")
    plane.store.start_command(session["instance_id"], command_id, started)
    return ok(None, "command started")


def finish_command(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    command_id = _command_id(req)
    body = _body(req, "command-finish.schema.json")
    if body["status"] not in FINISH_STATUSES:
        raise ApiError(400, "invalid instance command finish status")
    finished = _time(body, "finished_at")
    plane.store.command(session["instance_id"], command_id)  # 404 before the agent check, as the server
    _same_agent(session, body["agent_id"])
    plane.store.finish_command(session["instance_id"], command_id, body["status"], body.get("result"),
                               body.get("error_message"), finished)
    return ok(None, "command finished")


def skills_inventory(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    try:
        doc = parse_json_body(req.body)
    except BodyError as exc:
        raise ApiError(400, str(exc)) from None
    if isinstance(doc, dict) and doc.get("skills") is None:
        raise ApiError(400, "Skills is required")
    body = _body(req, "skills-inventory.schema.json")
    _same_agent(session, body["agent_id"])
    _time(body, "reported_at")
    for i, skill in enumerate(body["skills"]):
        try:
            parse_time(skill.get("collected_at"), f"skills/{i}/collected_at")
        except BodyError as exc:
            raise ApiError(400, str(exc)) from None
    plane.store.skills_inventory(session["instance_id"], body, plane.collect_skill_packages)
    return ok(None, "skill inventory synced")


def skills_upload(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    try:
        fields, files = upload.parse_multipart(req.headers.get("content-type", ""), req.body)
    except upload.UploadError as exc:
        raise ApiError(400, str(exc)) from None
    _validate_fields(fields)
    if "file" not in files:
        raise ApiError(400, "file is required")
    filename, data = files["file"]
    if not filename.lower().endswith(".zip"):
        raise ApiError(400, f"skill package must be a .zip file, not {filename!r}")
    if fields.get("agent_id") and fields["agent_id"] != session["agent_id"]:
        raise ApiError(403, "agent id does not match session")
    try:
        top_dir, md5 = upload.check_package(data)
    except upload.UploadError as exc:
        raise ApiError(500, str(exc)) from None  # unmapped on the real server: 500
    if fields.get("content_md5") and fields["content_md5"] != md5:
        raise ApiError(400, "skill_package_md5_mismatch")
    kept = plane.store.add_upload(session["instance_id"], filename, fields, top_dir, md5, data)
    return ok({"id": kept["upload_id"], "external_skill_id": f"skill_{kept['upload_id']}",
               "skill_key": st.skill_key(fields.get("identifier") or top_dir, md5),
               "name": fields.get("identifier") or top_dir, "status": "active",
               "source_type": fields.get("source") or "discovered_in_instance",
               "risk_level": "unknown", "scan_status": "skipped",
               "current_version_id": f"ver_{kept['version_id']}", "content_md5": md5},
              "skill package uploaded", status=201)


def _validate_fields(fields: dict[str, str]) -> None:
    try:
        check("skills-upload.schema.json", fields)
    except BodyError as exc:
        raise ApiError(400, str(exc)) from None


def skill_download(plane: Plane, req: Request) -> Response:
    _session(plane, req)  # CM-aug asks for the session; a runtime that sends it works with all
    try:
        number = st.version_number(req.params["version"])
    except ValueError:
        raise ApiError(500, "invalid skill version") from None
    found = plane.store.skill_version(number)
    if found is None:
        raise ApiError(500, "skill version not found")
    filename, data = found
    return Response(200, data, "application/octet-stream",
                    {"Content-Disposition": f'attachment; filename="{filename}"'})


def config_revision(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    raw = req.params["id"]
    if not re.fullmatch(r"[0-9]+", raw):
        raise ApiError(400, "Invalid config revision ID")
    rev = plane.store.config_revision(int(raw))
    if rev is None:
        raise ApiError(404, "instance config revision not found")
    if rev["instance_id"] != session["instance_id"]:
        raise ApiError(403, "Access denied")
    head = {"id": rev["id"], "instance_id": rev["instance_id"], "revision_no": rev["revision_no"],
            "checksum": rev["checksum"], "status": "published", "published_at": rfc3339(rev["published_at"])}
    # `content` goes out byte for byte as stored: its checksum is over exactly these bytes.
    head_text = json.dumps(head, separators=(",", ":"))[:-1]
    return ok(raw_data=f'{{"revision":{head_text},"content":{rev["content"]}}}}}', message="config revision")


def run_events(plane: Plane, req: Request) -> Response:
    session = _session(plane, req)
    body = _body(req, "run-events.schema.json")
    _same_agent(session, body["agent_id"])
    run_id = req.params["run_id"]
    for i, event in enumerate(body["events"]):
        if event["run_id"] != run_id:
            raise ApiError(400, f"events/{i}/run_id: {event['run_id']!r} is not this run ({run_id!r})")
    stored = plane.store.add_run_events(session["instance_id"], run_id, body["events"])
    # `accepted`: the batch is the plane's now (an event it held already is kept once: `stored` counts the new)
    return ok({"accepted": len(body["events"]), "stored": stored}, "run events stored")


Handler = Callable[["Plane", Request], Response]

ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", r"/api/v1/agent/register", register),
    ("POST", r"/api/v1/agent/heartbeat", heartbeat),
    ("GET", r"/api/v1/agent/commands/next", next_command),
    ("POST", r"/api/v1/agent/commands/(?P<id>[^/]+)/start", start_command),
    ("POST", r"/api/v1/agent/commands/(?P<id>[^/]+)/finish", finish_command),
    ("POST", r"/api/v1/agent/state/report", state_report),
    ("POST", r"/api/v1/agent/skills/inventory", skills_inventory),
    ("POST", r"/api/v1/agent/skills/upload", skills_upload),
    ("GET", r"/api/v1/agent/skills/versions/(?P<version>[^/]+)/download", skill_download),
    ("GET", r"/api/v1/agent/config/revisions/(?P<id>[^/]+)", config_revision),
    ("POST", r"/api/v1/agent/runs/(?P<run_id>[^/]+)/events", run_events),
]
_COMPILED = [(m, re.compile(p + r"\Z"), h) for m, p, h in ROUTES]


def route(method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
    """(handler, params) for an agent route, or None (the caller answers 404, empty body)."""
    for m, pattern, handler in _COMPILED:
        if m == method:
            found = pattern.match(path)
            if found:
                return handler, found.groupdict()
    return None


def preauth(plane: Plane, method: str, path: str, headers: dict[str, str]) -> Response | None:
    """The answer to a request whose token is wrong, decided before its body is read; None
    when the body may be read. An unauthenticated client never makes the plane buffer a body
    beyond the small cap of a path that is no route (a trailing slash: gin redirects first)."""
    found = route(method, path)
    if found is None:
        return None
    req = Request(method, path, headers, b"")
    try:
        if found[0] is register:
            token = bearer(req)
            if token is None:
                raise ApiError(401, "Agent bootstrap token is required")
            if plane.store.instance_for_token(token) is None:
                raise ApiError(400, "invalid agent bootstrap token")
        else:
            _session(plane, req)
    except ApiError as exc:
        return error(exc.status, exc.message)
    return None


def dispatch(plane: Plane, req: Request) -> Response:
    found = route(req.method, req.path)
    if found is None:
        return Response(404, b"", "text/plain; charset=utf-8")
    handler, req.params = found
    try:
        return handler(plane, req)
    except ApiError as exc:
        return error(exc.status, exc.message)
    except st.ColumnTooLong as exc:
        return error(500, str(exc))
    except st.NotFound as exc:
        return error(404, str(exc))
