#!/usr/bin/python
# Copyright: the pipexctl developers
# BSD-2-Clause (see the project's pyproject.toml)
"""Ansible module: turn pipexctl's offload on or off in xl2tpd's pppd options files."""

from __future__ import annotations

DOCUMENTATION = r"""
module: offload
short_description: Load pipexctl's pppd plugin from xl2tpd's pppd options files
author:
  - pipexctl developers (@pipexctl)
version_added: 0.1.0
description:
  - Writes (or removes) one marked block in each pppd options file that xl2tpd.conf names
    (C(pppoptfile)), so that every pppd xl2tpd starts asks C(pipexctl serve) for a kernel channel.
  - Never changes a line outside its block. Refuses a file that loads pipexctl.so or pppol2tp.so elsewhere.
  - Takes effect for the next call. Running calls keep their data path.
  - Runs with a Python that has pipexctl installed (set C(ansible_python_interpreter)).
  - The files' contents are returned only in diff mode (an options file can hold secrets).
options:
  xl2tpd_conf:
    type: path
    default: /etc/xl2tpd/xl2tpd.conf
    description: xl2tpd's configuration, read for its C(pppoptfile) lines.
  options_files:
    type: list
    elements: path
    description: The options files to manage (default, every C(pppoptfile) of I(xl2tpd_conf)).
  plugin:
    type: str
    default: pipexctl.so
    description: The plugin (a name in pppd's plugin directory, or a path).
  socket:
    type: str
    default: /run/pipexctl/serve.sock
    description: The socket of C(pipexctl serve) (C(pipexctl_socket)).
  required:
    type: bool
    default: false
    description: pppd fails instead of falling back to the pty (C(pipexctl_required)).
  timeout:
    type: int
    description: Seconds pppd waits for the daemon, 1 to 60 (C(pipexctl_timeout); the plugin's default is 5).
  move:
    type: int
    description:
      - A call left on its pty asks to be moved into the kernel every this many seconds, 0 to 3600; 0 never,
        and no control link, so no call moves back to its pty either (C(pipexctl_move); the plugin's default is 1).
  state:
    type: str
    default: present
    choices: [present, absent]
    description: Whether the block is there.
"""

EXAMPLES = r"""
- name: The offload on, with a pty fallback
  pipexctl.l2tp.offload:
    xl2tpd_conf: /etc/xl2tpd/xl2tpd.conf
    required: false
  vars:
    ansible_python_interpreter: /opt/pipexctl/venv/bin/python
"""

RETURN = r"""
files:
  description: The options files managed.
  type: list
  elements: str
  returned: always
changed_files:
  description: The options files this run changed (or would change, in check mode).
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(
            xl2tpd_conf=dict(type="path", default="/etc/xl2tpd/xl2tpd.conf"),
            options_files=dict(type="list", elements="path"),
            plugin=dict(type="str", default="pipexctl.so"),
            socket=dict(type="str", default="/run/pipexctl/serve.sock"),
            required=dict(type="bool", default=False),
            timeout=dict(type="int"),
            move=dict(type="int"),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        supports_check_mode=True,
    )
    try:
        from pipexctl.offload import pppopts
    except ImportError as e:
        module.fail_json(msg=f"pipexctl is not importable: {e} (set ansible_python_interpreter to pipexctl's venv)")
    from pipexctl import errors

    p = module.params
    try:
        # the same library functions as `pipexctl offload enable|disable`
        files = p["options_files"] or pppopts.files_of(p["xl2tpd_conf"])
        want = pppopts.block(p["plugin"], p["socket"], p["required"], p["timeout"], p["move"]) if p["state"] == "present" else None
        changes = pppopts.manage(files, want, write=not module.check_mode)
    except (ValueError, errors.PipexError) as e:
        module.fail_json(msg=str(e))
    # the files' contents only in diff mode: an options file can hold secrets
    extra = {"diff": {"before": "\n".join(f"# {c.path}\n{c.before}" for c in changes),
                      "after": "\n".join(f"# {c.path}\n{c.after}" for c in changes)}} if module._diff else {}
    module.exit_json(changed=bool(changes), files=files, changed_files=[c.path for c in changes], **extra)


if __name__ == "__main__":
    main()
