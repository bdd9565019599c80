"""boto3, the one S3 client (why: `loaders.remote.store`, docs/REMOTE.md "Client choice"): a client
per process with the policy's timeouts, and what its failures mean: retry, or fail at once naming
the URL and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loaders.remote.policy import INSTALL, RETRY_ENV, RemoteError, RemoteNotFound, RetryPolicy

MARKER = "shardsmith"  # the user agent's extra, so server logs tell our requests apart

SESSION_OPTIONS = (
    "profile_name",
    "region_name",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
)
CLIENT_OPTIONS = ("endpoint_url", "verify")
TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "500",
    "502",
    "503",
    "504",
}
DENIED_CODES = {
    "AccessDenied",
    "403",
    "401",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


def boto3_module() -> Any:
    try:
        import boto3  # optional extra (remote), and import weight: only remote datasets need it
    except ImportError:
        raise RemoteError("object storage", "the remote extra is not installed", INSTALL) from None
    return boto3


_LOADER: list[Any] = []  # botocore's data loader (read-only files, cached): shared by sessions


def make_client(url: str, options: Mapping[str, Any], retry: RetryPolicy) -> Any:
    """A boto3 S3 client of its own session (sessions are not thread- or fork-safe to share), with
    botocore's retries off (ours bound them) and the policy's timeouts."""
    import botocore.session  # optional extra (remote): comes with boto3
    from botocore.config import Config  # optional extra (remote): comes with boto3

    core = botocore.session.get_session()
    if _LOADER:  # the service models parsed once per process: a client took 0.10-0.27 s, 0.05 s now
        core.register_component("data_loader", _LOADER[0])
    else:
        _LOADER.append(core.get_component("data_loader"))
    session = boto3_module().session.Session(
        **{k: options[k] for k in SESSION_OPTIONS if k in options}, botocore_session=core
    )
    config = Config(
        connect_timeout=retry.connect_timeout_s,
        read_timeout=retry.timeout_s,
        retries={"total_max_attempts": 1},
        user_agent_extra=MARKER,
        max_pool_connections=32,
    )
    region = session.region_name or "us-east-1"  # S3 answers any region's bucket with a redirect
    return session.client(
        "s3",
        region_name=region,
        config=config,
        **{k: options[k] for k in CLIENT_OPTIONS if k in options},
    )


def error_code(e: BaseException) -> str:
    """An S3 error's code (``NoSuchKey``, ``403``, ...), '' for errors that are not answers."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def transient(e: BaseException) -> bool:
    """A failure worth retrying: no answer (connection refused or reset, timeout, a body cut short)
    or an answer that says "later" (5xx, throttling)."""
    from botocore import exceptions as bx  # optional extra (remote): comes with boto3

    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ParamValidationError)):
        return False
    if isinstance(
        e,
        (
            bx.EndpointConnectionError,
            bx.ConnectionError,
            bx.HTTPClientError,  # ConnectionClosedError and kin: a connection dropped
            bx.ConnectTimeoutError,
            bx.ReadTimeoutError,
            bx.ResponseStreamingError,
            bx.IncompleteReadError,
            ConnectionError,
            TimeoutError,
        ),
    ):
        return True
    if type(e).__module__.startswith("urllib3"):
        return True  # ProtocolError and kin: the connection broke mid-response
    response = getattr(e, "response", None)
    meta = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
    status = meta.get("HTTPStatusCode", 0)
    return error_code(e) in TRANSIENT_CODES or (isinstance(status, int) and status >= 500)


def translate(e: BaseException, url: str, op: str) -> RemoteError:
    """A boto3/botocore failure as a `RemoteError` naming the URL and the fix."""
    from botocore import exceptions as bx  # optional extra (remote): comes with boto3

    if isinstance(e, RemoteError):
        return e
    code = error_code(e)
    text = " ".join(str(e).split())[:300]
    if code in ("NoSuchBucket",):
        return RemoteNotFound(url, f"{op}: the bucket does not exist", "check the bucket name")
    if code in ("NoSuchKey", "404", "NotFound"):
        return RemoteNotFound(url, f"{op}: no such object", "check the URL (bucket, prefix, key)")
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return RemoteError(
            url,
            f"{op}: no credentials found",
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or storage_options "
            "aws_access_key_id/aws_secret_access_key): docs/REMOTE.md",
        )
    if code in DENIED_CODES:
        return RemoteError(
            url,
            f"{op}: access denied ({code}: {text})",
            "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and that "
            "they may access this bucket and prefix",
        )
    if transient(e) and not code:
        return RemoteError(
            url,
            f"{op}: the endpoint does not answer ({text})",
            "check AWS_ENDPOINT_URL and the network; retries are bounded by "
            f"{RETRY_ENV} (e.g. total_s=120,timeout_s=60)",
        )
    return RemoteError(url, f"{op} failed ({code or type(e).__name__}: {text})", "see the message")
