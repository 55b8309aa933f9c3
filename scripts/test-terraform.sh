#!/usr/bin/env bash
# Offline checks of terraform/: formatting, `terraform validate` of every
# module and of the example env, `terraform test` of the example env with
# a mocked AWS provider (a three-region plan, the variables it refuses),
# a plan of what `cellmesh plan` sizes for 100M DAU over five regions, and
# every role's rendered config through `cellmesh <role> --check-config`
# (each with the certificate `cellmesh pki issue-all` issued for its node),
# and `terraform apply`/`destroy` of the whole example env (two regions:
# instances, IAM, KMS, the certificate secrets, load balancers, peering,
# DNS) against moto_server (a local AWS API) on a loopback port, checked
# with boto3.
# The AWS provider comes from a local filesystem mirror (TF_PROVIDER_MIRROR,
# default /opt/tf-plugins); a project-local CLI config points at it.
#
#   scripts/test-terraform.sh [CELLMESH_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

bin="${1:-$CARGO_TARGET_DIR/debug/cellmesh}"
mirror="${TF_PROVIDER_MIRROR:-/opt/tf-plugins}"
command -v terraform >/dev/null || { echo "terraform not found: install Terraform >= 1.6"; exit 1; }
[ -d "$mirror/registry.terraform.io/hashicorp/aws" ] || {
  echo "no AWS provider under $mirror (set TF_PROVIDER_MIRROR to a filesystem mirror)"; exit 1; }
[ -x "$bin" ] || { echo "no cellmesh binary at $bin (cargo build first)"; exit 1; }

tf_cache="$HOME/.cache/cellmesh/terraform"
mkdir -p "$tf_cache"
export TF_CLI_CONFIG_FILE="$tf_cache/terraform.rc"
cat > "$TF_CLI_CONFIG_FILE" <<RC
provider_installation {
  filesystem_mirror {
    path    = "$mirror"
    include = ["registry.terraform.io/hashicorp/aws"]
  }
}
RC
export TF_IN_AUTOMATION=1 TF_INPUT=0
work=$(mktemp -d)
moto_pid=""
trap '[ -z "$moto_pid" ] || kill "$moto_pid" 2>/dev/null; rm -rf "$work"' EXIT

# terraform in DIR with its working data kept outside the clone.
tf() {
  local dir="$1"; shift
  TF_DATA_DIR="$tf_cache/data/${dir//\//_}" terraform -chdir="$dir" "$@"
}

echo "== terraform fmt -check"
terraform fmt -check -recursive terraform

for dir in terraform/modules/*/ terraform/envs/example terraform/tests/render; do
  dir="${dir%/}"
  if grep -q configuration_aliases "$dir"/*.tf; then
    # Takes providers from its caller: validated through envs/example.
    echo "== $dir: validated as part of terraform/envs/example"
    continue
  fi
  echo "== terraform validate $dir"
  tf "$dir" init -backend=false -no-color >"$work/init.log" || { cat "$work/init.log"; exit 1; }
  tf "$dir" validate -no-color
done

echo "== checkov (skipped checks: terraform/README.md)"
checkov="$HOME/.cache/cellmesh/checkov/bin/checkov"
if [ ! -x "$checkov" ]; then
  echo "setup: installing checkov into ~/.cache/cellmesh/checkov (a virtualenv)"
  python3 -m venv "$HOME/.cache/cellmesh/checkov"
  "$HOME/.cache/cellmesh/checkov/bin/pip" install -q checkov
fi
skipped=$(grep -oE '^\| CKV[0-9A-Z_, ]+' terraform/README.md | tr -d '| ' | paste -sd, -)
# The moto overrides are fragments merged into a test copy, not modules.
"$checkov" -d terraform --framework terraform --compact --quiet --skip-download --skip-check "$skipped" \
  --skip-path tests/moto/overrides

# A new CA in DIR and every certificate the variables in TFVARS call for.
issue_certificates() {
  "$bin" pki --dir "$1" init >/dev/null
  "$bin" pki --dir "$1" issue-all --tfvars "$2" | tail -1
}

echo "== cellmesh pki: a CA and every node's certificate for the test's variables"
example_vars=tests/example.tfvars.json
issue_certificates "$work/tls" "terraform/envs/example/$example_vars"

echo "== terraform test: three regions, and the variables refused"
tf terraform/envs/example test -no-color -filter=tests/example.tftest.hcl \
  -var-file="$example_vars" -var "tls_dir=$work/tls"

echo "== terraform test: a node without its certificate fails the plan, naming the command"
cp -r "$work/tls" "$work/tls-partial"
rm "$work/tls-partial/cell-us-east-1-c3.pem"
if tf terraform/envs/example test -no-color -filter=tests/example.tftest.hcl \
  -var-file="$example_vars" -var "tls_dir=$work/tls-partial" >"$work/partial.log" 2>&1; then
  echo "a plan without cell-us-east-1-c3's certificate passed"; exit 1
fi
tr -s ' \n' ' ' <"$work/partial.log" | grep -q 'lacks the certificates of cell-us-east-1-c3: run `cellmesh pki issue-all' \
  || { cat "$work/partial.log"; exit 1; }

echo "== cellmesh plan: 100M DAU over five regions, planned by the example env"
"$bin" plan --dau 100000000 --regions eu-west-1,eu-central-1,us-east-1,us-west-2,ap-southeast-1 \
  --kafka --tfvars "$work/plan.tfvars.json"
issue_certificates "$work/tls-sized" "$work/plan.tfvars.json"
tf terraform/envs/example test -no-color -filter=tests/sized.tftest.hcl -var-file="$work/plan.tfvars.json" \
  -var "tls_dir=$work/tls-sized"

echo "== rendered configs pass cellmesh <role> --check-config"
tf terraform/tests/render apply -auto-approve -no-color -state="$work/render.tfstate" -var "tls_dir=$work/tls" >/dev/null
tf terraform/tests/render output -state="$work/render.tfstate" -json configs >"$work/configs.json"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
for role, texts in json.load(open(f"{work}/configs.json")).items():
    for i, text in enumerate(texts):
        # Every process serves /metrics; traces go where a collector is set.
        assert 'metrics_listen = "0.0.0.0:' in text, (role, i, text)
        assert ("[telemetry]" in text) == ("otlp" in text or "collector" in text), (role, i, text)
        # Mutual TLS on every internal link; no shared secret, no plaintext.
        assert "\n[tls]\n" in text and "cluster_secret" not in text, (role, i, text)
        assert "insecure_plaintext" not in text, (role, i, text)
        open(f"{work}/{role}.{i}.toml", "w").write(text)
PY
for file in "$work"/*.toml; do
  name=$(basename "$file")
  "$bin" "${name%%.*}" --check-config "$file"
done

echo "== terraform apply and destroy of the whole example env (two regions) against moto"
command -v moto_server >/dev/null || { echo "moto_server not found: pip install 'moto[server]'"; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto_pid=$!
endpoint="http://127.0.0.1:$port"
for _ in $(seq 50); do curl -sf "$endpoint/moto-api/" >/dev/null && break; sleep 0.2; done
moto=terraform/tests/moto
issue_certificates "$work/tls-moto" "$moto/moto.tfvars.json"
# eu-west-1's load balancer terminates client TLS with an imported ACM
# certificate; us-east-1's passes TCP through.
acm=$(python3 "$moto/check.py" "$endpoint" acm "$work/tls-moto")
python3 - "$moto/moto.tfvars.json" "$acm" "$work/moto.tfvars.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
v["regions"]["eu-west-1"]["edge_certificate_arn"] = sys.argv[2]
json.dump(v, open(sys.argv[3], "w"))
PY
# A copy of terraform/ with what moto lacks overridden (see $moto/overrides).
mkdir -p "$work/tree"
cp -r terraform/modules terraform/envs "$work/tree/"
for module in "$moto"/overrides/*/; do
  cp "$module"*.tf "$work/tree/modules/$(basename "$module")/"
done
moto_tf() {
  AWS_ENDPOINT_URL="$endpoint" AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_EC2_METADATA_DISABLED=true \
    TF_DATA_DIR="$tf_cache/data/moto-env" terraform -chdir="$work/tree/envs/example" "$@" -no-color
}
vars=(-state="$work/moto.tfstate" -var-file="$work/moto.tfvars.json" -var "tls_dir=$work/tls-moto")
moto_tf init -backend=false >"$work/init.log" || { cat "$work/init.log"; exit 1; }
moto_tf apply -auto-approve "${vars[@]}" >"$work/apply.log" || { tail -60 "$work/apply.log"; exit 1; }
python3 "$moto/check.py" "$endpoint" present "$work/tls-moto" "$work/moto.tfvars.json"
moto_tf destroy -auto-approve "${vars[@]}" >"$work/destroy.log" || { tail -60 "$work/destroy.log"; exit 1; }
python3 "$moto/check.py" "$endpoint" absent "$work/moto.tfvars.json"
