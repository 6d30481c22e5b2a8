"""The Ansible side on the host: the options-file block (pppopts), the
role's unit template against systemd/pipexctl.service, the modules'
documentation against their argument specs, and ansible-playbook's syntax
check.  The modules and the role run for real in the guest
(tests/kernel/test_ansible_live.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, strategies as st

from pipexctl.offload import pppopts

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
COLLECTION = ANSIBLE / "collections" / "ansible_collections" / "pipexctl" / "l2tp"
ROLE = COLLECTION / "roles" / "lns"


def test_block_added_replaced_removed_and_nothing_else_touched():
    text = "noauth\n# mine\nmtu 1400"
    b1 = pppopts.block(socket="/run/a.sock")
    once = pppopts.apply(text, b1)
    assert once.startswith(text + "\n") and once.endswith(b1)
    assert pppopts.apply(once, b1) == once  # idempotent
    b2 = pppopts.block(socket="/run/b.sock", required=True, timeout=9, move=0)
    twice = pppopts.apply(once, b2)
    assert pppopts.current(twice) == b2 and twice.count("# BEGIN pipexctl") == 1
    assert "pipexctl_required\n" in twice and "pipexctl_timeout 9\n" in twice and "pipexctl_move 0\n" in twice
    assert pppopts.apply(twice, None) == text + "\n"


@pytest.mark.parametrize("line", ["plugin pppol2tp.so", "plugin /usr/lib/pppd/2.4.9/pipexctl.so  # old"])
def test_refuses_a_file_that_loads_a_plugin_outside_the_block(line):
    with pytest.raises(ValueError, match="outside pipexctl's block"):
        pppopts.apply(f"noauth\n{line}\n", pppopts.block())


@pytest.mark.parametrize("kw", [{"socket": "/run/x y"}, {"plugin": "a#b"}, {"timeout": 0}, {"timeout": 61}, {"socket": ""},
                                {"move": -1}, {"move": 3601}])
def test_bad_block_values(kw):
    with pytest.raises(ValueError):
        pppopts.block(**kw)


def test_option_files_of_xl2tpd_conf():
    conf = ("[global]\n[lns default]\npppoptfile = /etc/ppp/options.lns ; comment\n"
            "[lac a]\npppoptfile=/etc/ppp/options.lac\n[lac b]\npppoptfile = /etc/ppp/options.lac\n"
            "; pppoptfile = /commented\n")
    assert pppopts.option_files(conf) == ["/etc/ppp/options.lns", "/etc/ppp/options.lac"]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_any_file_round_trips(text):
    """Whatever is in the file (outside our markers): add then remove gives it back."""
    if "# BEGIN pipexctl" in text or "# END pipexctl" in text:
        return
    try:
        added = pppopts.apply(text, pppopts.block())
    except ValueError:
        return  # loads a plugin itself: refused, tested above
    back = pppopts.apply(added, None)
    assert back == (text if not text or text.endswith("\n") else text + "\n")


@pytest.mark.parametrize("name,differ", [("pipexctl.service", ["Environment", "ExecStart"]),
                                         ("pipexctl.socket", ["ListenStream"])])
def test_unit_templates_are_the_shipped_units_but_for_paths(name, differ):
    unit = (ROOT / "systemd" / name).read_text().splitlines()
    tmpl = (ROLE / "templates" / f"{name}.j2").read_text().splitlines()
    tmpl = [ln for ln in tmpl if not ln.startswith("# {{ ansible_managed }}") and "role pipexctl.l2tp.lns" not in ln
            and "tests/unit/test_ansible.py" not in ln]
    diff = [(a, b) for a, b in zip(unit, tmpl) if a != b]
    assert len(unit) == len(tmpl)
    assert [a.split("=")[0] for a, _ in diff] == differ


@pytest.mark.parametrize("name", ["session", "offload"])
def test_module_documentation_matches_its_argument_spec(name):
    src = (COLLECTION / "plugins" / "modules" / f"{name}.py").read_text()
    tree = ast.parse(src)
    consts = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
              and n.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")}
    doc = yaml.safe_load(consts["DOCUMENTATION"])
    yaml.safe_load(consts["EXAMPLES"])
    spec = next(n for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg == "argument_spec")
    args = {k.arg for k in spec.value.keywords}
    assert doc["module"] == name and set(doc["options"]) == args and doc["author"]
    assert "Copyright" in src.splitlines()[1] and "BSD-2-Clause" in src.splitlines()[2]
    for opt, d in doc["options"].items():  # every option fully described (block YAML, no flow-style surprises)
        assert isinstance(d["description"], (str, list)) and d["type"], opt


def _ansible_env(tmp_path=None):
    return {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": str(ANSIBLE / "collections"), "ANSIBLE_NOCOLOR": "1",
            **({"ANSIBLE_LOCAL_TEMP": str(tmp_path)} if tmp_path else {})}


@pytest.mark.parametrize("name", ["pipexctl.l2tp.session", "pipexctl.l2tp.offload"])
def test_ansible_doc_renders_each_module(name, tmp_path):
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), name], capture_output=True, text=True,
                       env=_ansible_env(tmp_path), cwd=ANSIBLE)
    assert r.returncode == 0 and "OPTIONS" in r.stdout and "EXAMPLES" in r.stdout, r.stdout + r.stderr
    assert "AUTHOR: pipexctl developers" in r.stdout, r.stdout
    assert "ERROR" not in r.stderr and "WARNING" not in r.stderr, r.stderr


def test_the_collection_builds_and_its_role_has_an_argument_spec(tmp_path):
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-galaxy"), "collection", "build", "--output-path",
                        str(tmp_path), str(COLLECTION)], capture_output=True, text=True, env=_ansible_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    (tar,) = tmp_path.glob("pipexctl-l2tp-*.tar.gz")
    import tarfile

    names = tarfile.open(tar).getnames()
    assert {"plugins/modules/offload.py", "plugins/modules/session.py", "roles/lns/tasks/main.yml",
            "roles/lns/meta/argument_specs.yml", "meta/runtime.yml", "MANIFEST.json"} <= set(names)
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert set(spec) == set(defaults), set(spec) ^ set(defaults)


def test_playbooks_pass_ansible_syntax_check():
    env = _ansible_env()
    for pb, inv in ((ANSIBLE / "site.yml", ANSIBLE / "inventory.ini"),
                    (ROOT / "tests" / "kernel" / "ansible" / "session.yml", "localhost,"),
                    (ROOT / "tests" / "kernel" / "ansible" / "offload.yml", "localhost,")):
        r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "--syntax-check", "-i", str(inv),
                            str(pb)], capture_output=True, text=True, cwd=ANSIBLE, env=env)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("damage", [lambda t: t.replace("# END pipexctl\n", ""),
                                    lambda t: t + pppopts.block().replace("# END pipexctl\n", ""),
                                    lambda t: t + pppopts.block()])
def test_a_damaged_block_is_refused_not_guessed(damage):
    """A lost END line must not make `absent` delete the user's lines after it."""
    text = damage("noauth\n" + pppopts.block() + "mtu 1400\nrequire-mschap-v2\n")
    for want in (None, pppopts.block()):
        with pytest.raises(ValueError, match="damaged"):
            pppopts.apply(text, want)


def test_the_roles_packages_are_debian_packages_installed_here():
    """The role's apt task installs these (the live role test skips that task:
    apt is Ansible's, and it cost ~48 s per run under TCG).  scripts/setup.sh
    installs the same packages on this Debian 12 host, so dpkg knows each
    name; a misspelt or renamed package fails here."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    pkgs = defaults["pipexctl_packages"]
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Status}\\n", *pkgs], capture_output=True, text=True)
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert r.returncode == 0 and set(got) == set(pkgs), r.stderr
    assert all(v == "install ok installed" for v in got.values()), got
