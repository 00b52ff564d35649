//! `sqlx::migrate!` embeds `migrations/` at compile time; on stable Rust it cannot tell cargo
//! to rebuild when a migration is added, so this does.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
