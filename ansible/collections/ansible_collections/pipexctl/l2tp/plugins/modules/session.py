#!/usr/bin/python
# Copyright: the pipexctl developers
# BSD-2-Clause (see the project's pyproject.toml)
"""Ansible module: a static kernel L2TP session (and its tunnel) through pipexctl."""

from __future__ import annotations

DOCUMENTATION = r"""
module: session
short_description: Kernel L2TP sessions and tunnels through pipexctl's library
author:
  - pipexctl developers (@pipexctl)
version_added: 0.1.0
description:
  - Makes a kernel L2TP session (and, when missing, its unmanaged tunnel) exist or not, through the
    C(l2tp) generic-netlink family, like C(pipexctl addsess) and C(pipexctl delsess).
  - For static pseudowires (L2TPv3 Ethernet sessions). PPP sessions of xl2tpd calls are offloaded by
    C(pipexctl serve), not by this module.
  - Idempotent. A session or tunnel that exists with other parameters is an error, never replaced.
  - Runs with a Python that has pipexctl installed (set C(ansible_python_interpreter)).
options:
  tunnel_id:
    type: int
    required: true
    description: Our tunnel id.
  session_id:
    type: int
    required: true
    description: Our session id.
  peer_tunnel_id:
    type: int
    description: The peer's tunnel id (needed to create the tunnel).
  peer_session_id:
    type: int
    description: The peer's session id (required with I(state=present)).
  version:
    type: int
    default: 3
    choices: [2, 3]
    description: L2TP version.
  pw:
    type: str
    default: eth
    choices: [eth, ppp]
    description: Pseudowire type.
  encap:
    type: str
    default: udp
    choices: [udp, ip]
    description: Tunnel encapsulation.
  local:
    type: str
    description: Local address[:port] of the tunnel (to create it).
  remote:
    type: str
    description: Remote address[:port] of the tunnel (to create it).
  ifname:
    type: str
    description: Interface name of an Ethernet session.
  netns:
    type: str
    description: Network namespace (as C(ip netns) names it) to work in.
  keep_tunnel:
    type: bool
    default: false
    description: With I(state=absent), keep the tunnel when it is left empty.
  state:
    type: str
    default: present
    choices: [present, absent]
    description: Whether the session exists.
"""

EXAMPLES = r"""
- name: Pseudowire 10 in tunnel 100 to the peer
  pipexctl.l2tp.session:
    tunnel_id: 100
    peer_tunnel_id: 200
    session_id: 10
    peer_session_id: 20
    local: 192.0.2.1:5000
    remote: 192.0.2.2:5000
    ifname: l2tpeth10
  vars:
    ansible_python_interpreter: /opt/pipexctl/venv/bin/python
"""

RETURN = r"""
session:
  description: The session after the run (none when absent).
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(
            tunnel_id=dict(type="int", required=True),
            session_id=dict(type="int", required=True),
            peer_tunnel_id=dict(type="int"),
            peer_session_id=dict(type="int"),
            version=dict(type="int", default=3, choices=[2, 3]),
            pw=dict(type="str", default="eth", choices=["eth", "ppp"]),
            encap=dict(type="str", default="udp", choices=["udp", "ip"]),
            local=dict(type="str"),
            remote=dict(type="str"),
            ifname=dict(type="str"),
            netns=dict(type="str"),
            keep_tunnel=dict(type="bool", default=False),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        required_if=[("state", "present", ("peer_session_id",))],
        required_together=[("peer_tunnel_id", "local", "remote")],
        supports_check_mode=True,
    )
    try:
        from pipexctl import errors
        from pipexctl.kernel.backend import NetlinkBackend
        from pipexctl.model import Encap, Endpoint, PwType, SessionSpec, TunnelSpec
        from pipexctl.orchestrator import Orchestrator
    except ImportError as e:
        module.fail_json(msg=f"pipexctl is not importable by {module._name}'s interpreter: {e} "
                             "(set ansible_python_interpreter to pipexctl's venv)")
    p = module.params
    present = p["state"] == "present"
    backend = None
    try:
        tunnel = None
        if p["peer_tunnel_id"] is not None:
            tunnel = TunnelSpec(tunnel_id=p["tunnel_id"], peer_tunnel_id=p["peer_tunnel_id"], version=p["version"],
                                encap=Encap(p["encap"]), local=Endpoint.parse(p["local"]),
                                remote=Endpoint.parse(p["remote"]))
        session = SessionSpec(tunnel_id=p["tunnel_id"], session_id=p["session_id"],
                              peer_session_id=p["peer_session_id"] if present else 1, version=p["version"],
                              pw_type=PwType(p["pw"]), ifname=p["ifname"])
        backend = NetlinkBackend(netns=p["netns"])
        res = Orchestrator(backend).ensure_session(session, tunnel, present, check=module.check_mode,
                                                   tunnel_too=not p["keep_tunnel"])
    except errors.PipexError as e:
        module.fail_json(msg=str(e))
    except ValueError as e:  # a spec refused (records.Invalid: ids out of range, bad endpoints)
        module.fail_json(msg=str(e))
    finally:
        if backend is not None:
            backend.close()
    module.exit_json(changed=res["changed"], session=res["after"],
                     diff={"before": res["before"] or {}, "after": res["after"] or {}})


if __name__ == "__main__":
    main()
