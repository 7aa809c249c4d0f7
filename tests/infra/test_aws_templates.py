"""Issue 13, item 3: the CloudFormation template ``infra/aws/dasflow.yaml``.

- cfn-lint passes (no errors, no warnings);
- it deploys to moto (CloudFormation + S3 + IAM + KMS); the buckets have encryption, versioning, public-access
  blocks, and the ledger bucket COMPLIANCE object lock;
- the deployed role and bucket policies, evaluated exactly (tests/infra/iam_eval.py), deny the postprocess and
  release roles every S3 read action on confidential data (inputs and the true histograms under prepared/) and
  any listing of it, while validate/preprocess/measure can read it; only the measure role can write ledger
  entries and noisy measurements; no stage role can delete or overwrite confidential inputs.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.infra.iam_eval import evaluate, wildcard_match

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS..S3..BucketPolicy")
REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra/aws/dasflow.yaml"
PRE = ("Validate", "Preprocess", "Measure")
POST = ("Postprocess", "Release")
#: every object-level S3 action that returns object data or metadata (the service authorization reference's
#: s3 actions on the ``object`` resource type that read: GetObject*, RestoreObject; SelectObjectContent is
#: authorized by s3:GetObject)
READ_ACTIONS = [
    "s3:GetObject", "s3:GetObjectAcl", "s3:GetObjectAnnotation", "s3:GetObjectAttributes", "s3:GetObjectLegalHold",
    "s3:GetObjectRetention", "s3:GetObjectTagging", "s3:GetObjectTorrent", "s3:GetObjectVersion",
    "s3:GetObjectVersionAcl", "s3:GetObjectVersionAnnotation", "s3:GetObjectVersionAnnotationForReplication",
    "s3:GetObjectVersionAttributes", "s3:GetObjectVersionForReplication", "s3:GetObjectVersionTagging",
    "s3:GetObjectVersionTorrent", "s3:RestoreObject",
]
CONFIDENTIAL_KEYS = ["prod/confidential/phsafe/persons.csv", "prod/confidential/x",
                     "prod/runs/r1/prepared/counts/state.parquet",
                     "prod/runs/2020-us/prepared/phsafe/deep/nested.parquet"]


def test_cfn_lint_is_clean() -> None:
    """cfn-lint (dev extra) reports nothing on the template."""
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    if not cfn_lint.exists():
        pytest.fail("cfn-lint is not installed: `.venv/bin/pip install cfn-lint` (it belongs in the dev extra)")
    done = subprocess.run([str(cfn_lint), str(TEMPLATE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def deployed() -> Iterator[dict[str, Any]]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        cfn = boto3.client("cloudformation", region_name="us-east-1")
        cfn.create_stack(StackName="dasflow", TemplateBody=TEMPLATE.read_text(), Capabilities=["CAPABILITY_IAM"])
        stack = cfn.describe_stacks(StackName="dasflow")["Stacks"][0]
        assert stack["StackStatus"] == "CREATE_COMPLETE", stack
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        iam = boto3.client("iam", region_name="us-east-1")
        s3 = boto3.client("s3", region_name="us-east-1")
        roles: dict[str, list[dict[str, Any]]] = {}
        for stage in (*PRE, *POST):
            name = outputs[f"{stage}RoleArn"].rsplit("/", 1)[1]
            roles[stage] = [_doc(iam.get_role_policy(RoleName=name, PolicyName=p)["PolicyDocument"])
                            for p in iam.list_role_policies(RoleName=name)["PolicyNames"]]
            assert roles[stage], stage
        # moto's CloudFormation has no AWS::S3::BucketPolicy: apply the template's document, resolved against the
        # deployed stack, through the S3 API, and read it back as S3 stores it
        template = _template()
        props = template["Resources"]["StoreBucketPolicy"]["Properties"]
        s3.put_bucket_policy(Bucket=outputs["StoreBucketName"],
                             Policy=json.dumps(_resolve(props["PolicyDocument"], outputs)))
        bucket_policy = json.loads(s3.get_bucket_policy(Bucket=outputs["StoreBucketName"])["Policy"])
        yield {"outputs": outputs, "roles": roles, "bucket_policy": bucket_policy, "s3": s3}


def _doc(document: Any) -> dict[str, Any]:
    """moto returns CloudFormation-created inline policies as the repr of a dict, API-created ones as JSON."""
    if isinstance(document, str):
        try:
            return dict(json.loads(document))
        except json.JSONDecodeError:
            return dict(ast.literal_eval(document))
    return dict(document)


def _template() -> dict[str, Any]:
    from cfnlint.decode import decode_str

    template, errors = decode_str(TEMPLATE.read_text())
    assert not errors and template is not None, errors
    return dict(template)


def _resolve(node: Any, outputs: dict[str, str]) -> Any:
    """Resolve the intrinsic functions the bucket policy uses (Ref, Fn::GetAtt Arn, Fn::Sub) from stack outputs."""
    def value(name: str) -> str:
        if name == "StorePrefix":
            return "prod"
        if name == "StoreBucket":
            return outputs["StoreBucketName"]
        if name == "StoreBucket.Arn":
            return f"arn:aws:s3:::{outputs['StoreBucketName']}"
        if name.endswith("Role.Arn"):
            return outputs[name.removesuffix(".Arn") + "Arn"]
        raise AssertionError(f"cannot resolve {name!r}")

    if isinstance(node, dict):
        if set(node) == {"Ref"}:
            return value(node["Ref"])
        if set(node) == {"Fn::GetAtt"}:
            return value(".".join(node["Fn::GetAtt"]))
        if set(node) == {"Fn::Sub"}:
            return re.sub(r"\$\{([^}]+)\}", lambda m: value(m.group(1)), node["Fn::Sub"])
        return {k: _resolve(v, outputs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, outputs) for v in node]
    return node


def _decide(deployed: dict[str, Any], stage: str, action: str, resource: str,
            context: dict[str, str] | None = None) -> str:
    arn = deployed["outputs"][f"{stage}RoleArn"]
    ctx = {"aws:PrincipalArn": arn, "aws:SecureTransport": "true", **(context or {})}
    return evaluate([*deployed["roles"][stage], deployed["bucket_policy"]], action, resource, ctx)


def _obj(deployed: dict[str, Any], key: str, bucket: str = "StoreBucketName") -> str:
    return f"arn:aws:s3:::{deployed['outputs'][bucket]}/{key}"


def test_outputs_give_the_store_uri(deployed: dict[str, Any]) -> None:
    assert deployed["outputs"]["StoreUri"] == f"s3://{deployed['outputs']['StoreBucketName']}/prod"


def test_buckets_are_encrypted_versioned_private_and_ledger_is_object_locked(deployed: dict[str, Any]) -> None:
    """Encryption is checked on the moto deployment; moto's CloudFormation applies no other bucket property
    (versioning, public-access block, object lock), so those are checked in the template cfn-lint validated."""
    s3, out = deployed["s3"], deployed["outputs"]
    algorithms = {}
    for key in ("StoreBucketName", "ReleaseBucketName", "LedgerBucketName"):
        rule = s3.get_bucket_encryption(Bucket=out[key])["ServerSideEncryptionConfiguration"]["Rules"][0]
        algorithms[key] = rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"]
    assert algorithms == {"StoreBucketName": "aws:kms", "ReleaseBucketName": "AES256", "LedgerBucketName": "AES256"}
    resources = _template()["Resources"]
    for name in ("StoreBucket", "ReleaseBucket", "LedgerBucket"):
        props = resources[name]["Properties"]
        assert resources[name]["DeletionPolicy"] == "Retain"
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}
        block = props["PublicAccessBlockConfiguration"]
        assert set(block) == {"BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"}
        assert all(v is True for v in block.values()), (name, block)
        assert ("ObjectLockConfiguration" in props) == (name == "LedgerBucket")
    lock = resources["LedgerBucket"]["Properties"]
    assert lock["ObjectLockEnabled"] is True
    assert lock["ObjectLockConfiguration"]["ObjectLockEnabled"] == "Enabled"
    assert lock["ObjectLockConfiguration"]["Rule"]["DefaultRetention"] == {"Mode": "COMPLIANCE",
                                                                           "Days": {"Ref": "LedgerRetentionDays"}}


@pytest.mark.parametrize("stage", POST)
def test_post_noise_roles_cannot_read_any_confidential_data(deployed: dict[str, Any], stage: str) -> None:
    """The core rule: postprocess/release get no read action at all on confidential inputs or true histograms."""
    for key in CONFIDENTIAL_KEYS:
        for action in READ_ACTIONS:
            assert _decide(deployed, stage, action, _obj(deployed, key)) == "explicit-deny", (stage, action, key)
    store = f"arn:aws:s3:::{deployed['outputs']['StoreBucketName']}"
    for prefix in ("prod/confidential/", "prod/confidential/phsafe/", "prod/"):
        assert _decide(deployed, stage, "s3:ListBucket", store, {"s3:prefix": prefix}) != "allow", prefix


@pytest.mark.parametrize("stage", POST)
def test_post_noise_roles_read_noisy_measurements_and_public_inputs(deployed: dict[str, Any], stage: str) -> None:
    """The denials are targeted, not blanket: the post stages can do their job."""
    for key in ("prod/runs/r1/measurements/counts/state.parquet", "prod/runs/r1/config.json",
                "prod/public/counts/states.csv", "prod/runs/r1/ledger/plan.json"):
        assert _decide(deployed, stage, "s3:GetObject", _obj(deployed, key)) == "allow", key
    store = f"arn:aws:s3:::{deployed['outputs']['StoreBucketName']}"
    assert _decide(deployed, stage, "s3:ListBucket", store, {"s3:prefix": "prod/runs/r1/"}) == "allow"


@pytest.mark.parametrize("stage", PRE)
def test_pre_noise_roles_read_confidential_data(deployed: dict[str, Any], stage: str) -> None:
    for key in CONFIDENTIAL_KEYS:
        assert _decide(deployed, stage, "s3:GetObject", _obj(deployed, key)) == "allow", key
    assert _decide(deployed, stage, "kms:Decrypt", "arn:aws:kms:us-east-1:123456789012:key/x") == "implicit-deny"


def test_only_measure_writes_ledger_entries_and_noisy_measurements(deployed: dict[str, Any]) -> None:
    keys = ["prod/runs/r1/ledger/entries/counts/state.committed.json",
            "prod/runs/r1/measurements/counts/state.parquet"]
    create_only = {"s3:if-none-match": "*"}
    for stage in (*PRE, *POST):
        for key in keys:
            decision = _decide(deployed, stage, "s3:PutObject", _obj(deployed, key), create_only)
            assert (decision == "allow") == (stage == "Measure"), (stage, key, decision)
            # without If-None-Match a PUT could overwrite: refused to every role, Measure included
            assert _decide(deployed, stage, "s3:PutObject", _obj(deployed, key)) == "explicit-deny", (stage, key)


def test_frozen_records_are_create_only_for_every_role(deployed: dict[str, Any]) -> None:
    """Issue 22: the frozen config, the plan and the approval record can be created (If-None-Match: *) by the
    stage that writes them, and overwritten by no role; ordinary run state stays writable."""
    frozen = ["prod/runs/r1/config.json", "prod/runs/r1/config.sha256", "prod/runs/r1/ledger/plan.json",
              "prod/runs/r1/approval.json"]
    for stage in (*PRE, *POST):
        for key in frozen:
            assert _decide(deployed, stage, "s3:PutObject", _obj(deployed, key)) == "explicit-deny", (stage, key)
    for key in frozen:
        assert _decide(deployed, "Validate", "s3:PutObject", _obj(deployed, key),
                       {"s3:if-none-match": "*"}) == "allow", key
    assert _decide(deployed, "Preprocess", "s3:PutObject",
                   _obj(deployed, "prod/runs/r1/prepared/counts/state.parquet")) == "allow"


def test_every_bucket_is_tls_only_access_logged_and_under_a_data_event_trail() -> None:
    """Checked in the template (moto's CloudFormation has no CloudTrail and applies no bucket policy or logging)."""
    resources = _template()["Resources"]
    buckets = ["StoreBucket", "ReleaseBucket", "LedgerBucket", "AuditLogBucket"]
    policies = {r["Properties"]["Bucket"]["Ref"]: r["Properties"]["PolicyDocument"]["Statement"]
                for r in resources.values() if r["Type"] == "AWS::S3::BucketPolicy"}
    for name in buckets:
        tls = [st for st in policies[name] if st.get("Sid") == "DenyInsecureTransport"]
        assert tls and tls[0]["Effect"] == "Deny" and tls[0]["Condition"] == {
            "Bool": {"aws:SecureTransport": "false"}}, name
        if name != "AuditLogBucket":
            logging = resources[name]["Properties"]["LoggingConfiguration"]
            assert logging["DestinationBucketName"] == {"Ref": "AuditLogBucket"}, name
    ledger_create_only = [st for st in policies["LedgerBucket"] if st.get("Sid") == "CreateOnly"]
    assert ledger_create_only[0]["Condition"] == {"Null": {"s3:if-none-match": "true"}}
    trail = next(r for r in resources.values() if r["Type"] == "AWS::CloudTrail::Trail")["Properties"]
    assert trail["IsLogging"] is True and trail["EnableLogFileValidation"] is True
    selector = trail["EventSelectors"][0]
    assert selector["ReadWriteType"] == "All"
    covered = {v["Fn::Sub"].split(".Arn}")[0].lstrip("${") for v in selector["DataResources"][0]["Values"]}
    assert covered == {"StoreBucket", "ReleaseBucket", "LedgerBucket"}


def test_no_stage_role_deletes_or_overwrites_confidential_inputs(deployed: dict[str, Any]) -> None:
    for stage in (*PRE, *POST):
        for action in ("s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectAcl"):
            assert _decide(deployed, stage, action, _obj(deployed, "prod/confidential/phsafe/persons.csv")) \
                != "allow", (stage, action)
        ledger_archive = _obj(deployed, "r1/ledger.csv", "LedgerBucketName")
        assert (_decide(deployed, stage, "s3:PutObject", ledger_archive) == "allow") == (stage == "Release")
        assert _decide(deployed, stage, "s3:DeleteObject", ledger_archive) != "allow"


def test_insecure_transport_is_denied_to_everyone(deployed: dict[str, Any]) -> None:
    for stage in (*PRE, *POST):
        decision = _decide(deployed, stage, "s3:GetObject", _obj(deployed, "prod/public/counts/states.csv"),
                           {"aws:SecureTransport": "false"})
        assert decision == "explicit-deny"


# ---- the evaluator itself -------------------------------------------------------------------------------------

def test_evaluator_wildcards_deny_precedence_and_conditions() -> None:
    allow_all = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    deny_conf = {"Statement": [{"Effect": "Deny", "Action": "s3:GetObject*", "Resource": "arn:aws:s3:::b/c/*"}]}
    assert evaluate([allow_all], "s3:GetObject", "arn:aws:s3:::b/c/x") == "allow"
    assert evaluate([allow_all, deny_conf], "s3:getobjectversion", "arn:aws:s3:::b/c/x/y") == "explicit-deny"
    assert evaluate([allow_all, deny_conf], "s3:GetObject", "arn:aws:s3:::b/C/x") == "allow"  # resources: case
    assert evaluate([deny_conf], "s3:PutObject", "arn:aws:s3:::b/c/x") == "implicit-deny"
    assert evaluate([], "s3:GetObject", "arn:aws:s3:::b/k") == "implicit-deny"
    assert wildcard_match("a?c", "abc") and not wildcard_match("a?c", "abbc")
    assert wildcard_match("b/runs/*/prepared/*", "b/runs/r1/x/prepared/y")
    not_action = {"Statement": [{"Effect": "Deny", "NotAction": "s3:Get*", "Resource": "*"}]}
    assert evaluate([allow_all, not_action], "s3:PutObject", "x") == "explicit-deny"
    assert evaluate([allow_all, not_action], "s3:GetObject", "x") == "allow"
    cond = {"Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
                           "Condition": {"StringLike": {"s3:prefix": ["runs/*", "public/*"]}}}]}
    assert evaluate([cond], "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "runs/r1/"}) == "allow"
    assert evaluate([cond], "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "confidential/"}) == "implicit-deny"
    assert evaluate([cond], "s3:ListBucket", "arn:aws:s3:::b") == "implicit-deny"  # missing key: no match
    negated = {"Statement": [{"Effect": "Deny", "Action": "*", "Resource": "*",
                              "Condition": {"StringNotEquals": {"aws:PrincipalArn": "arn:aws:iam::1:role/a"}}}]}
    assert evaluate([allow_all, negated], "s3:GetObject", "x", {"aws:PrincipalArn": "arn:aws:iam::1:role/b"}) \
        == "explicit-deny"
    assert evaluate([allow_all, negated], "s3:GetObject", "x", {"aws:PrincipalArn": "arn:aws:iam::1:role/a"}) \
        == "allow"
    assert evaluate([allow_all, negated], "s3:GetObject", "x") == "explicit-deny"  # negated + missing key
    absent = {"Statement": [{"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*",
                             "Condition": {"Null": {"s3:if-none-match": "true"}}}]}
    assert evaluate([allow_all, absent], "s3:PutObject", "x") == "explicit-deny"
    assert evaluate([allow_all, absent], "s3:PutObject", "x", {"s3:if-none-match": "*"}) == "allow"


def test_evaluator_refuses_what_it_does_not_implement() -> None:
    for statement in ({"Effect": "Allow", "Action": "*", "Resource": "arn:aws:s3:::b/${aws:username}/*"},
                      {"Effect": "Allow", "Action": "*", "Resource": "*",
                       "Condition": {"NumericLessThan": {"s3:max-keys": "10"}}},
                      {"Effect": "Allow", "Action": "*", "Resource": "*", "Principal": {"AWS": "arn:aws:iam::1:root"}}):
        with pytest.raises(ValueError):
            evaluate([{"Statement": [statement]}], "s3:GetObject", "arn:aws:s3:::b/u/k")
