"""Publishing: access rules, the dry-run plan, and the real `huggingface_hub` calls.

The Hub is unreachable here. The upload tests run `HfApi(endpoint=...)` against a
recording HTTP server on 127.0.0.1 (no patching): it answers create_repo, repo settings,
repo_info, create_branch, preupload and commit. Its preupload answer puts every file in
"regular" upload mode, so `upload_folder` sends file contents inside the commit payload and
never reaches Xet/LFS storage, which a local server cannot fake; that storage path is the
one part of a real push these tests do not exercise.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from huggingface_hub import DatasetCard, HfApi, constants

from builders.assembly.settings import BuildSettings
from builders.hub.preview import add_preview_config
from builders.hub.publish import (
    PublishPlan,
    PublishRefused,
    access_refusal,
    inspect_build,
    plan_publish,
    planned_files,
    publish,
    upload_groups,
)
from builders.hub.validate import validate
from cxr_vqa.cli import main
from cxr_vqa.gating import GATING

from .publish_builds import built, copy_build

TOKEN = "hf_recordingServerSecret0123456789"


@pytest.fixture(scope="session")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("builds")


class RecordingHub(BaseHTTPRequestHandler):
    """The few Hub endpoints `create_repo`, `update_repo_settings`, `repo_info` and `upload_folder` call."""

    requests: list[dict]
    repos: dict[str, dict]
    commits: list[dict]
    on_commit = None
    """Called once a commit is recorded, before the answer: what happens on the machine meanwhile."""

    def log_message(self, *args):
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> bytes:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(
            {"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        return body

    def do_POST(self):
        body = self._record()
        endpoint = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"
        if self.path == "/api/repos/create":
            payload = json.loads(body)
            repo = f"{payload['organization']}/{payload['name']}"
            if repo in self.repos:
                return self._reply(
                    409, {"error": "You already created this dataset repo", "url": f"{endpoint}/datasets/{repo}"}
                )
            self.repos[repo] = {"private": payload.get("visibility") == "private", "gated": False}
            return self._reply(200, {"url": f"{endpoint}/datasets/{repo}"})
        if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/preupload/([^/?]+)(\?.*)?", self.path):
            files = json.loads(body)["files"]
            return self._reply(
                200,
                {
                    "files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files
                    ]
                },
            )
        if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/commit/([^/?]+)(\?.*)?", self.path):
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            files = {
                line["value"]["path"]: base64.b64decode(line["value"]["content"])
                for line in lines
                if line["key"] == "file"
            }
            self.commits.append({"repo": m.group(1), "revision": m.group(2), "files": files})
            if type(self).on_commit is not None:
                type(self).on_commit()
            return self._reply(
                200,
                {
                    "commitUrl": f"{endpoint}/datasets/{m.group(1)}/commit/{'a' * 40}",
                    "commitOid": "a" * 40,
                    "pullRequestUrl": None,
                },
            )
        if re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/branch/([^/?]+)", self.path):
            return self._reply(200, {})
        if self.path == "/api/validate-yaml":
            return self._reply(200, {"errors": [], "warnings": []})
        self._reply(404, {"error": f"not recorded: POST {self.path}"})

    def do_PUT(self):
        body = self._record()
        if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/settings", self.path):
            settings = json.loads(body)
            if "gated" in settings:
                self.repos[m.group(1)]["gated"] = settings["gated"]
            if "visibility" in settings:
                self.repos[m.group(1)]["private"] = settings["visibility"] == "private"
            return self._reply(200, {})
        self._reply(404, {"error": f"not recorded: PUT {self.path}"})

    def do_GET(self):
        self._record()
        if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)(/revision/[^/?]+)?(\?.*)?", self.path):
            repo = self.repos.get(m.group(1))
            if repo is None:
                return self._reply(404, {"error": "Repository not found"})
            return self._reply(
                200,
                {
                    "id": m.group(1),
                    "sha": "b" * 40,
                    "private": repo["private"],
                    "gated": repo["gated"],
                    "siblings": [],
                    "tags": [],
                    "downloads": 0,
                    "likes": 0,
                },
            )
        self._reply(404, {"error": f"not recorded: GET {self.path}"})


@pytest.fixture
def hub(monkeypatch):
    """A recording Hub on 127.0.0.1; `HF_TOKEN` set to a secret the output must never show."""
    handler = type("Hub", (RecordingHub,), {"requests": [], "repos": {}, "commits": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    handler.endpoint = endpoint
    yield handler
    server.shutdown()
    server.server_close()


def api(hub) -> HfApi:
    return HfApi(endpoint=hub.endpoint)


@pytest.fixture(scope="module")
def private_plan(root) -> PublishPlan:
    """The real embed build's private plan, made (and the build validated) once for the tests that only read it."""
    return plan_publish(built("real-embed", root), "org/gemex", "private")


def refusal(folder: Path, visibility: str, confirm_public: bool = False, text_licence: str | None = None) -> str:
    """What `plan_publish` refuses, by the access rules alone: for a folder as a `plan_publish` of the same
    test has already validated it (validation reads every config through `load_dataset`)."""
    return access_refusal(inspect_build(folder), visibility, confirm_public, text_licence) or ""


# -- access rules --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["real-embed", "real-none"])
def test_credentialed_content_never_public(root, kind):
    with pytest.raises(PublishRefused) as err:
        plan_publish(built(kind, root), "org/gemex", "public", confirm_public=True)
    message = str(err.value)
    assert "\n" not in message and "--private or --gated" in message
    assert ("image-mode none" in message) if kind == "real-embed" else ("report text" in message)


@pytest.mark.parametrize("visibility", ["private", "gated"])
def test_credentialed_content_goes_private_or_gated(root, visibility, private_plan):
    plan = private_plan if visibility == "private" else plan_publish(built("real-embed", root), "org/gemex", visibility)
    assert plan.visibility == visibility and plan.facts.carries and not plan.facts.synthetic


def record_checksums(folder: Path) -> None:
    """Write the shards' checksums into the build report, as a build that wrote these shards would."""
    from builders.assembly.shards import sha256

    report = json.loads((folder / "build_report.json").read_text())
    report["shards"] = {rel: sha256(folder / rel) for rel in report["shards"]}
    (folder / "build_report.json").write_text(json.dumps(report))


def null_columns(folder: Path, columns: tuple[str, ...]) -> None:
    """Empty `columns` in every shard (an annotation-only build without that text), checksums rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in (folder / "data").rglob("*.parquet"):
        table = pq.read_table(path)
        for column in columns:
            field = table.schema.field(column)
            table = table.set_column(table.schema.get_field_index(column), field, pa.nulls(table.num_rows, field.type))
        pq.write_table(table, path)
    record_checksums(folder)


def test_gemex_mimic_text_goes_public_only_under_a_named_licence(root, tmp_path, capsys):
    """Question and reason text is derived from MIMIC-CXR reports."""
    folder = copy_build("real-none", root, tmp_path / "gemex")
    null_columns(folder, ("report",))
    with pytest.raises(
        PublishRefused, match=r"question and reason text is derived from MIMIC-CXR reports.*--text-licence NAME"
    ):
        plan_publish(folder, "org/gemex", "public", confirm_public=True)
    card = DatasetCard.load(folder / "README.md")
    card.data["license"], card.data["tags"] = "cc-by-4.0", ["synthetic"]  # the card is never trusted
    card.save(folder / "README.md")
    plan = plan_publish(folder, "org/gemex", "public", confirm_public=True, text_licence="CC-BY-4.0")
    assert "--text-licence NAME" in refusal(folder, "public", confirm_public=True)
    assert "credentialed access only" in refusal(
        folder, "public", True, "PhysioNet Credentialed Health Data License 1.5.0"
    )
    assert "needs --confirm-public" in refusal(folder, "public", text_licence="CC-BY-4.0")
    assert plan.card_fields == {"license": "other", "license_name": "CC-BY-4.0", "license_link": None}
    assert (
        main(
            [
                "publish",
                str(folder),
                "--repo",
                "org/gemex",
                "--public",
                "--confirm-public",
                "--text-licence",
                "CC-BY-4.0",
                "--dry-run",
            ]
        )
        == 0
    )
    assert "licence CC-BY-4.0 [set by --text-licence]" in capsys.readouterr().out


def test_public_annotations_need_none_mode_a_licence_and_confirmation(root, tmp_path):
    folder = copy_build("real-none", root, tmp_path / "gemex")
    null_columns(folder, ("report", "question", "reason"))  # no report or MIMIC-derived text left
    with pytest.raises(PublishRefused, match="credentialed access only"):
        plan_publish(folder, "org/gemex", "public", confirm_public=True)  # the card says PhysioNet licence
    card = DatasetCard.load(folder / "README.md")
    card.data["license"], card.data["license_name"], card.data["license_link"] = "other", None, None
    card.save(folder / "README.md")
    with pytest.raises(PublishRefused, match="does not say which licence"):
        plan_publish(folder, "org/gemex", "public", confirm_public=True)
    card.data["license"] = "cc-by-nc-4.0"
    card.save(folder / "README.md")
    assert plan_publish(folder, "org/gemex", "public", confirm_public=True).visibility == "public"
    assert "needs --confirm-public" in refusal(folder, "public")


def test_real_rexvqa_is_never_public_whatever_its_columns(tmp_path):
    """An unedited --image-mode none ReXVQA build, then one with every text column emptied."""
    import pyarrow.parquet as pq

    from builders.provenance import MANIFEST_NAME
    from rexvqa_dataset.build import build_rexvqa
    from rexvqa_dataset.synthetic.release import generate

    release = generate(tmp_path / "release", num_studies=6, images=False)
    (release.root / MANIFEST_NAME).unlink()
    folder = tmp_path / "rexvqa"
    build_rexvqa(BuildSettings(source=release.root, out=folder, image_mode="none"))
    card = DatasetCard.load(folder / "README.md")
    card.data["license"], card.data["license_name"], card.data["license_link"] = "cc-by-4.0", None, None
    card.save(folder / "README.md")
    with pytest.raises(PublishRefused, match="ReXVQA builds of real data"):
        plan_publish(folder, "org/rexvqa", "public", confirm_public=True)
    assert "ReXVQA builds of real data" in refusal(folder, "public", True, "CC-BY-4.0")
    shard = next((folder / "data").rglob("*.parquet"))
    strings = [
        f.name
        for f in pq.read_schema(shard)
        if str(f.type) == "string" and f.name not in ("question_id", "study_id", "split")
    ]
    null_columns(folder, tuple(strings))
    (folder / "build_report.json").write_text(
        json.dumps({**json.loads((folder / "build_report.json").read_text()), "dataset": "other"})
    )
    with pytest.raises(PublishRefused, match="ReXVQA builds of real data"):
        plan_publish(folder, "org/rexvqa", "public", confirm_public=True)


def test_synthetic_demo_may_go_public_with_confirmation(root):
    folder = built("synthetic-embed", root)
    assert inspect_build(folder).synthetic
    with pytest.raises(PublishRefused, match="needs --confirm-public"):
        plan_publish(folder, "org/demo", "public")
    assert not refusal(folder, "public", confirm_public=True) and inspect_build(folder).carries


def test_reference_builds_are_never_uploaded(root):
    with pytest.raises(PublishRefused, match="image-mode reference"):
        plan_publish(built("synthetic-reference", root), "org/demo", "private")


def test_preview_image_of_a_real_build_stays_out_of_public(root, tmp_path):
    folder = copy_build("real-none", root, tmp_path / "gemex")
    (folder / "preview.png").write_bytes(b"png")
    facts = inspect_build(folder)
    assert any("preview.png" in c for c in facts.carries)


def test_gated_plan_adds_the_gating_fields(root, tmp_path):
    plan = plan_publish(copy_build("synthetic-embed", root, tmp_path / "gemex"), "org/demo", "gated", gating=GATING)
    assert set(plan.card_fields) == {"extra_gated_prompt", "extra_gated_fields"}
    assert "checkbox" in plan.card_fields["extra_gated_fields"].values()
    assert plan_publish(built("real-embed", root), "org/gemex", "gated").card_fields == {}  # the real card has them


def test_gated_refused_for_a_card_without_gating_when_the_dataset_names_none(root, tmp_path):
    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    with pytest.raises(PublishRefused, match="--gated refused: the card has no extra_gated_prompt"):
        plan_publish(folder, "org/demo", "gated", gating={"rexvqa": GATING["rexvqa"]})


def test_unready_folder_is_refused(root, tmp_path):
    folder = copy_build("real-embed", root, tmp_path / "gemex")
    next((folder / "data" / "test").glob("*.parquet")).write_bytes(b"")
    with pytest.raises(Exception, match="not ready for the Hub"):
        plan_publish(folder, "org/gemex", "private")


# -- dry run --------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_no_token(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    folder = built("real-embed", root)
    assert main(["publish", str(folder), "--repo", "org/gemex", "--gated", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "access: gated, requests approved by hand" in out and "licence physionet" in out
    assert "config default: train" in out and "README.md" in out and "build_report.json" in out
    assert "token: found" in out and TOKEN not in out


def test_cli_refusal_is_one_line(root, capsys):
    assert main(["publish", str(built("real-embed", root)), "--repo", "org/gemex", "--public", "--confirm-public"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cxr-vqa: error: --public takes only")


# -- against the recording Hub ------------------------------------------------------------


def assert_uploaded(hub, plan) -> None:
    """Every planned file arrived, in publish's commits: one per config's shard set, then the card."""
    assert [sorted(c["files"]) for c in hub.commits] == [sorted(group) for group in upload_groups(plan.files)]
    for commit in hub.commits:
        assert commit["repo"] == plan.repo_id and commit["revision"] == plan.revision
        for path, content in commit["files"].items():
            assert content == (plan.folder / path).read_bytes()


def test_each_config_shard_set_is_a_commit_of_its_own_largest_first_card_last(private_plan):
    """Xet deduplicates against earlier uploads, not within one: the first (largest) shard set stores
    the images, later ones reference them; the card comes when every file it names is there."""
    plan = private_plan
    groups = upload_groups(plan.files)
    sizes = dict(plan.files)
    *shard_sets, rest = groups
    assert sorted(rest) == sorted(p for p, _ in plan.files if not p.startswith("data/")) and "README.md" in rest
    prefixes = [{p.rsplit("/", 1)[1].split("-")[0] for p in group} for group in shard_sets]
    assert all(len(names) == 1 for names in prefixes) and len(prefixes) == 5  # four types and sft_per_image
    assert {"sft_per_image"} in prefixes
    assert all(len({p.split("/")[1] for p in group}) == 3 for group in shard_sets)  # every split of the config
    totals = [sum(sizes[p] for p in group) for group in shard_sets]
    assert totals == sorted(totals, reverse=True)
    assert sorted(p for g in groups for p in g) == sorted(p for p, _ in plan.files)


def test_private_upload(private_plan, hub, capsys, caplog):
    plan = private_plan
    url = publish(plan, api(hub))
    assert url.endswith("a" * 40)
    create = next(r for r in hub.requests if r["path"] == "/api/repos/create")
    assert json.loads(create["body"])["visibility"] == "private" and json.loads(create["body"])["type"] == "dataset"
    assert hub.repos["org/gemex"] == {"private": True, "gated": False}
    assert_uploaded(hub, plan)
    repo_calls = [
        r for r in hub.requests if r["path"].startswith(("/api/repos/", "/api/datasets/", "/api/validate-yaml"))
    ]
    assert len(repo_calls) >= 4 and all(r["auth"] == f"Bearer {TOKEN}" for r in repo_calls)
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err + caplog.text


def test_gated_upload_gates_before_uploading(root, hub, tmp_path):
    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    plan = plan_publish(folder, "org/demo", "gated", revision="v1", gating=GATING)
    publish(plan, api(hub))
    paths = [(r["method"], r["path"].split("?")[0]) for r in hub.requests]
    settings = paths.index(("PUT", "/api/datasets/org/demo/settings"))
    assert settings < paths.index(("POST", "/api/datasets/org/demo/commit/v1"))
    assert json.loads(hub.requests[settings]["body"]) == {"gated": "manual"}
    assert ("POST", "/api/datasets/org/demo/branch/v1") in paths
    assert hub.repos["org/demo"] == {"private": False, "gated": "manual"}
    card = DatasetCard(hub.commits[-1]["files"]["README.md"].decode())
    assert card.data["extra_gated_prompt"] and "checkbox" in card.data["extra_gated_fields"].values()
    assert_uploaded(hub, plan)


def test_private_plan_never_uploads_into_an_existing_public_repo(private_plan, hub):
    hub.repos["org/gemex"] = {"private": False, "gated": False}
    with pytest.raises(PublishRefused, match="not private; nothing uploaded"):
        publish(private_plan, api(hub))
    assert hub.commits == []


def test_public_synthetic_upload_with_preview(root, hub, tmp_path):
    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    add_preview_config(folder, n=4)
    plan = plan_publish(folder, "org/demo", "public", confirm_public=True)
    publish(plan, api(hub))
    assert hub.repos["org/demo"]["private"] is False
    sent = {path for commit in hub.commits for path in commit["files"]}
    assert "preview.png" in sent and "data/test/preview-00000-of-00001.parquet" in sent


def test_rerun_resumes(private_plan, hub):
    """The same plan published twice (the folder is unchanged, so a rerun plans the same files)."""
    plan = private_plan
    publish(plan, api(hub))
    publish(plan, api(hub))
    assert hub.repos["org/gemex"]["private"] is True and len(hub.commits) == 2 * len(upload_groups(plan.files))


def test_cli_publish(root, hub, capsys):
    assert main(["publish", str(built("real-embed", root)), "--repo", "org/gemex", "--private"]) == 0
    out = capsys.readouterr()
    assert "published" in out.out and TOKEN not in out.out + out.err
    assert hub.commits and hub.repos["org/gemex"]["private"] is True


# -- what is uploaded ----------------------------------------------------------------


def test_a_file_the_build_did_not_write_is_refused_by_name(root, tmp_path):
    folder = copy_build("synthetic-none", root, tmp_path / "gemex")
    (folder / "data" / "test" / "patient.jpg").write_bytes(b"\xff\xd8\xff\xe0 an untagged image")
    with pytest.raises(ValueError, match=r"not ready for the Hub: data/test/patient.jpg: \[unlisted-file\]"):
        plan_publish(folder, "org/demo", "public", confirm_public=True)


def test_only_what_the_build_listed_is_uploaded(root, hub, tmp_path):
    folder = copy_build("synthetic-none", root, tmp_path / "gemex")
    (folder / ".notes.json").write_text("{}")  # hidden: never uploaded, not a problem
    plan = plan_publish(folder, "org/demo", "public", confirm_public=True)
    report = json.loads((folder / "build_report.json").read_text())
    assert {path for path, _ in plan.files} == {"README.md", "build_report.json", *report["shards"]}
    publish(plan, api(hub))
    assert {path for commit in hub.commits for path in commit["files"]} == {path for path, _ in plan.files}


def _as_list(path: str | list[str]) -> list[str]:
    return [path] if isinstance(path, str) else list(path)


def test_a_card_reading_another_builds_shards_is_refused(root, tmp_path):
    """A synthetic build's card pointed at a real build's shards beside it never goes public."""
    copy_build("real-none", root, tmp_path / "real")
    folder = copy_build("synthetic-none", root, tmp_path / "gemex")
    card = DatasetCard.load(folder / "README.md")
    for config in card.data["configs"]:
        config["data_files"] = [
            {"split": e["split"], "path": [f"../real/{p}" for p in _as_list(e["path"])]} for e in config["data_files"]
        ]
    card.save(folder / "README.md")
    with pytest.raises(ValueError, match="points outside data/"):
        plan_publish(folder, "org/demo", "public", confirm_public=True)


@pytest.mark.parametrize("kind", ["synthetic-none", "synthetic-reference"])
def test_a_folder_without_its_build_report_is_refused(root, tmp_path, kind):
    """No report, no checksum check and no image mode: refused, never planned."""
    folder = copy_build(kind, root, tmp_path / "gemex")
    (folder / "build_report.json").unlink()
    with pytest.raises(ValueError, match=r"\[build-report\] no build_report.json"):
        plan_publish(folder, "org/demo", "private")
    facts = inspect_build(folder)
    refusal = access_refusal(facts, "gated")
    assert ("image-mode reference" in refusal) if kind == "synthetic-reference" else ("no build_report.json" in refusal)


def test_a_reference_build_whose_report_says_embed_is_still_refused(root, tmp_path):
    folder = copy_build("synthetic-reference", root, tmp_path / "gemex")
    report = json.loads((folder / "build_report.json").read_text())
    report["settings"]["image_mode"] = "embed"
    (folder / "build_report.json").write_text(json.dumps(report))
    with pytest.raises(PublishRefused, match="image-mode reference"):
        plan_publish(folder, "org/demo", "gated")


@pytest.mark.parametrize("licence", [" ", "MIMIC-CXR data use agreement", "cc-by-nc-4.0", "other"])
def test_text_licence_must_allow_public_redistribution(root, tmp_path, licence):
    folder = copy_build("real-none", root, tmp_path / "gemex")
    null_columns(folder, ("report",))
    with pytest.raises(PublishRefused, match=r"not one of the licences that allow public redistribution: cc-by-4\.0"):
        plan_publish(folder, "org/gemex", "public", confirm_public=True, text_licence=licence)
    assert not refusal(folder, "public", True, "cc0-1.0")


# -- links in a build folder ----------------------------------------------------------------


def _linked_splits(folder: Path, elsewhere: Path) -> None:
    """Each `data/<split>` moved out of the folder and replaced by a link to where it went."""
    elsewhere.mkdir()
    for split in sorted((folder / "data").iterdir()):
        split.rename(elsewhere / split.name)
        split.symlink_to(elsewhere / split.name, target_is_directory=True)


@pytest.mark.parametrize("licence", [[], ["--text-licence", "cc-by-4.0"]])
def test_a_build_whose_split_folders_are_links_is_refused(root, tmp_path, capsys, licence):
    """A real `--image-mode none` GEMeX build (its `report` column holds report text) with data/<split> linked
    elsewhere: the access checks must see the shards the upload would send, so publish refuses it."""
    plain = copy_build("real-none", root, tmp_path / "plain")
    command = ["--repo", "org/gemex", "--public", "--confirm-public", *licence, "--dry-run"]
    assert main(["publish", str(plain), *command]) == 1
    assert (
        "error: --public refused" in capsys.readouterr().err
    )  # the same folder without links: refused for its content

    folder = copy_build("real-none", root, tmp_path / "gemex")
    _linked_splits(folder, tmp_path / "elsewhere")
    assert main(["publish", str(folder), *command]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[link] a symbolic link" in err and "dry run" not in err
    assert {p.rule for p in validate(folder)} == {"link"} and len(validate(folder)) == len(
        list((folder / "data").iterdir())
    )
    assert main(["validate", str(folder)]) == 1


def test_a_linked_shard_or_a_link_above_a_listed_file_is_refused(root, tmp_path):
    folder = copy_build("synthetic-none", root, tmp_path / "gemex")
    shard = sorted((folder / "data" / "test").glob("*.parquet"))[0]
    shard.rename(tmp_path / shard.name)
    shard.symlink_to(tmp_path / shard.name)
    assert [(p.file, p.rule) for p in validate(folder)] == [(shard.relative_to(folder).as_posix(), "link")]
    with pytest.raises(ValueError, match=r"\[link\]"):
        plan_publish(folder, "org/demo", "public", confirm_public=True)
    with pytest.raises(PublishRefused, match="is a symbolic link"):  # the upload's own list refuses it too
        planned_files(folder)


def test_a_hidden_link_is_never_uploaded_and_not_a_problem(root, tmp_path):
    folder = copy_build("synthetic-none", root, tmp_path / "gemex")
    (folder / ".cache").symlink_to(tmp_path, target_is_directory=True)
    assert validate(folder) == []


def test_a_rebuild_during_the_upload_sends_nothing_of_it(root, hub, tmp_path):
    """A synthetic build going public is rebuilt in place (`build --overwrite`) from the real release
    while its first commit is under way: every later commit still sends the checked bytes."""
    import hashlib

    from gemex_dataset.build import build_gemex

    from .publish_builds import _release

    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    plan = plan_publish(folder, "org/demo", "public", confirm_public=True)
    checked = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name, _ in plan.files}
    real = _release(root, synthetic=False)

    def rebuild():
        if len(hub.commits) == 1:
            settings = BuildSettings(
                source=real / "per_type", out=folder, images=real / "files", image_mode="embed", overwrite=True
            )
            build_gemex(settings)

    hub.on_commit = rebuild
    publish(plan, api(hub))
    assert len(hub.commits) == len(upload_groups(plan.files)) > 2
    sent = {path: content for commit in hub.commits for path, content in commit["files"].items()}
    assert {path: hashlib.sha256(content).hexdigest() for path, content in sent.items()} == checked
    assert inspect_build(folder).synthetic is False  # the folder now holds the real build, which never went up
    assert any((folder / path).read_bytes() != content for path, content in sent.items())


def test_a_file_changed_between_the_check_and_the_upload_stops_it(root, hub, tmp_path):
    folder = copy_build("synthetic-embed", root, tmp_path / "gemex")
    plan = plan_publish(folder, "org/demo", "public", confirm_public=True)
    (folder / "README.md").write_text((folder / "README.md").read_text() + "\nedited after the check\n")
    with pytest.raises(PublishRefused, match=r"README\.md is not the file that was checked"):
        publish(plan, api(hub))
    assert hub.commits == []
