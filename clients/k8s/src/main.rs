//! `signet-k8s`: the Kubernetes bridge binary.

fn main() {
    println!("signet-k8s: under construction");
}
