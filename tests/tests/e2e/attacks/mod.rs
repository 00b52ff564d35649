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
//! | a thief holding a copied key (a CA's or a workload's) | `stolen_key_*` |

mod support;

mod database_ca_slot_injection;
mod database_ledger_rollback;
mod database_ledger_tamper;
mod database_ledger_times;
mod database_replica_mismatch;
mod database_stalls;
mod federation_foreign_identity;
mod impersonator_privileged;
mod local_user_files;
mod local_user_mint_key_mode;
mod local_user_workload_api;
mod network_limits;
mod network_plugged_ca_sibling;
mod network_probe_starvation;
mod network_reserved_names;
mod network_retired_jwks_key;
mod network_server_impersonation;
mod other_namespace_dns_templates;
mod other_namespace_pods;
mod stolen_key_intermediate;
mod stolen_key_renewal;
mod tenant_issuer_credentials;
mod tenant_secret_sink;
mod workload_fork_exec;
mod workload_mtls_renewal;
mod workload_sink_links;
mod workload_stale_crl;
mod workload_stuck_sink;
