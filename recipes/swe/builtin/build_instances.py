import importlib.util, json, os, pathlib, re, shutil, subprocess, sys, tempfile
sys.path.insert(0, "/tmp/swe_gen")
BUILTIN = pathlib.Path("/work/main/recipes/swe/builtin")
spec = importlib.util.spec_from_file_location("make_repo", BUILTIN / "make_repo.py")
mr = importlib.util.module_from_spec(spec); spec.loader.exec_module(mr)

import tasks_minicalc, tasks_textkit, tasks_datespan
TEST_COMMAND = "python -m pytest -rA -p no:cacheprovider"
STATUS = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(.*)$")

def outcomes(cwd):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", COLUMNS="200")
    env.pop("PYTEST_ADDOPTS", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider"], cwd=cwd, env=env, capture_output=True, text=True)
    res = {}
    in_summary = False
    for line in p.stdout.splitlines():
        if "short test summary info" in line:
            in_summary = True; continue
        if not in_summary: continue
        m = STATUS.match(line)
        if m:
            nodeid = m.group(2).split(" - ", 1)[0].strip()
            st = m.group(1)
            if res.get(nodeid, "PASSED") == "PASSED":
                res[nodeid] = st
    return res, p.stdout

def apply_edits(root, edits):
    for edit in edits:
        kind, path = edit[0], root / edit[1]
        s = path.read_text() if path.exists() else ""
        if kind == "append":
            s = s + edit[2]
        elif kind == "replace":
            assert s.count(edit[2]) == 1, (edit[1], edit[2])
            s = s.replace(edit[2], edit[3])
        path.write_text(s)

def diff_of(root):
    mr.git(["add", "-A"], root)
    d = mr.git(["diff", "--cached", "--no-color", "--no-ext-diff", "--full-index"], root).stdout
    mr.git(["reset", "-q", "--hard"], root)
    return d

def files_in(patch):
    return re.findall(r"^diff --git a/(\S+) b/", patch, re.M)

def is_test(path):
    parts = path.split("/")
    return "tests" in parts[:-1] or parts[-1].startswith("test_") or parts[-1] == "conftest.py"

instances = []
counters = {}
hashes = {}
tmp = pathlib.Path(tempfile.mkdtemp(prefix="swegen-"))
for task in tasks_minicalc.TASKS + tasks_textkit.TASKS + tasks_datespan.TASKS:
    repo = task["repo"]
    counters[repo] = counters.get(repo, 0) + 1
    iid = f"{repo}__{counters[repo]}"
    root = tmp / iid
    base = mr.materialize(repo, root)
    hashes.setdefault(repo, base); assert hashes[repo] == base
    apply_edits(root, task["tests"]); test_patch = diff_of(root)
    apply_edits(root, task["gold"]); patch = diff_of(root)
    assert all(is_test(f) for f in files_in(test_patch)) and not any(is_test(f) for f in files_in(patch))
    # condition A: base + test_patch
    for p in [test_patch]:
        subprocess.run(["git", "apply", "-"], input=p, text=True, cwd=root, check=True)
    a, out_a = outcomes(root)
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=root, check=True)
    b, out_b = outcomes(root)
    bad_b = sorted(k for k, v in b.items() if v != "PASSED")
    assert not bad_b, (iid, bad_b, out_b[-3000:])
    f2p = sorted(k for k, v in a.items() if v != "PASSED" and b.get(k) == "PASSED")
    p2p = sorted(k for k, v in a.items() if v == "PASSED" and b.get(k) == "PASSED")
    assert set(a) == set(b), (iid, set(a) ^ set(b))
    if sorted(task["expect_f2p"]) != f2p:
        print("F2P MISMATCH", iid, "expected", sorted(task["expect_f2p"]), "got", f2p)
        print(out_a[-4000:])
        sys.exit(1)
    instances.append(dict(instance_id=iid, repo=repo, base_commit=base,
        problem_statement=task["problem_statement"], patch=patch, test_patch=test_patch,
        FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, test_command=TEST_COMMAND, created_at="2026-12-02"))
    print(iid, "F2P", len(f2p), "P2P", len(p2p))
shutil.rmtree(tmp)
with open(BUILTIN / "instances.jsonl", "w", encoding="utf-8") as fh:
    for inst in instances:
        fh.write(json.dumps(inst, ensure_ascii=False) + "\n")
print("wrote", len(instances))
