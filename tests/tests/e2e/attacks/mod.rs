//! The attack suite, organised by the threat model's actors (SECURITY.md). Each module performs
//! attacks against the real binaries and checks that they are refused, and that what the same
//! actor may legitimately do still works. Module names are `<actor>_<topic>`:
//!
//! | actor | modules |
//! |---|---|
//! | a workload on a node | `workload_*` |
//! | another uid on the node | `local_user_*` |
//! | a pod in another namespace | `other_namespace_*` |
//! | a tenant who administers a namespace | `tenant_*` |
//! | a compromised agent | `agent_*` |
//! | a compromised impersonator | `impersonator_*` |
//! | a network attacker | `network_*` |
//! | someone with database access | `database_*` |

mod support;

mod database_ledger_tamper;
mod database_ledger_times;
mod impersonator_privileged;
mod network_plugged_ca_sibling;
mod network_reserved_names;
mod other_namespace_dns_templates;
mod workload_mtls_renewal;
