-- How each node attested: 'join_token' (one-time join token) or 'k8s_psat' (Kubernetes
-- projected service-account token). Nodes attested before this column existed used a join token.
ALTER TABLE nodes ADD COLUMN attestation TEXT NOT NULL DEFAULT 'join_token';
