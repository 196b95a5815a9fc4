# bench/garage.sh — sourced by bench/s3.sh and bench/s3-peers.sh: starts a one-node Garage
# server (the S3 store of tests/s3.rs; `cargo install garage`) on the loopback interface
# with its data under $W, a bucket `bench` and a key for it.
# Sets: G (the server's pid), S3 (its S3 port), KEY, SECRET; exports AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY and an rclone remote `G:` on it; waits until the bucket answers.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPC=$(port); S3=$(port)
cat > "$W/garage.toml" <<EOT
metadata_dir = "$W/meta"
data_dir = "$W/data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$RPC"
rpc_public_addr = "127.0.0.1:$RPC"
rpc_secret = "$(openssl rand -hex 32)"
[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$S3"
root_domain = ".s3.garage.localhost"
EOT
garage -c "$W/garage.toml" server > "$W/garage.log" 2>&1 &
G=$!
gc() { garage -c "$W/garage.toml" "$@"; }
for _ in $(seq 100); do gc status >/dev/null 2>&1 && break; sleep 0.2; done
ID=$(gc node id -q | cut -d@ -f1)
gc layout assign -z dc1 -c 4G "$ID" >/dev/null
gc layout apply --version 1 >/dev/null
gc bucket create bench >/dev/null
KEYOUT=$(gc key create bench-key)
gc bucket allow --read --write --owner bench --key bench-key >/dev/null
KEY=$(sed -n 's/^Key ID: *//p' <<<"$KEYOUT")
SECRET=$(sed -n 's/^Secret key: *//p' <<<"$KEYOUT")
export AWS_ACCESS_KEY_ID=$KEY AWS_SECRET_ACCESS_KEY=$SECRET
unset AWS_CA_BUNDLE # rclone's AWS SDK refuses its own HTTP transport with one set
export RCLONE_CONFIG_G_TYPE=s3 RCLONE_CONFIG_G_PROVIDER=Other \
  RCLONE_CONFIG_G_ENDPOINT=http://127.0.0.1:$S3 RCLONE_CONFIG_G_REGION=garage \
  RCLONE_CONFIG_G_ACCESS_KEY_ID=$KEY RCLONE_CONFIG_G_SECRET_ACCESS_KEY=$SECRET
# The layout reaches the S3 front end a moment later.
for _ in $(seq 100); do rclone lsd G:bench >/dev/null 2>&1 && break; sleep 0.2; done
