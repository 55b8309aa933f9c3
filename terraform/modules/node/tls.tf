# This process's certificate bundle (the deployment's CA and revocation
# list, its own certificate and key, issued by `cellmesh pki issue-all`)
# as one Secrets Manager secret encrypted with the region's KMS key.
# Only this instance's role may read it; cloud-init fetches it at boot
# and a timer every five minutes after (renewals and revocations arrive
# that way). No key travels in user data. The secret's value passes
# through Terraform's state: see terraform/README.md.

locals {
  tls_files = var.tls == null ? {} : {
    ca   = "${var.tls.dir}/ca.pem"
    crl  = "${var.tls.dir}/crl.pem"
    cert = "${var.tls.dir}/${var.tls.stem}.pem"
    key  = "${var.tls.dir}/${var.tls.stem}.key"
  }
}

data "aws_region" "current" {}

resource "aws_secretsmanager_secret" "tls" {
  count                   = var.tls == null ? 0 : 1
  name                    = "${var.name}/tls"
  description             = "cellmesh ${var.role} ${var.tls.stem}: CA, revocation list, certificate and key"
  kms_key_id              = var.tls.kms_key_arn
  recovery_window_in_days = var.tls.recovery_days
  tags                    = { "cellmesh:role" = var.role }
}

resource "aws_secretsmanager_secret_version" "tls" {
  count         = var.tls == null ? 0 : 1
  secret_id     = aws_secretsmanager_secret.tls[0].id
  secret_string = jsonencode({ for k, path in local.tls_files : k => try(file(path), "") })
  lifecycle {
    precondition {
      condition     = alltrue([for path in values(local.tls_files) : fileexists(path)])
      error_message = "No certificate for ${var.name} in tls_dir (${try(local.tls_files.cert, "")}): run `cellmesh pki issue-all --dir TLS_DIR --tfvars terraform.tfvars.json`."
    }
  }
}

resource "aws_iam_role_policy" "tls" {
  count = var.tls == null ? 0 : 1
  name  = "read-own-certificate"
  role  = aws_iam_role.this.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ReadOwnCertificate"
        Effect   = "Allow"
        Action   = ["secretsmanager:GetSecretValue"]
        Resource = [aws_secretsmanager_secret.tls[0].arn]
      },
      {
        Sid      = "DecryptThroughSecretsManager"
        Effect   = "Allow"
        Action   = ["kms:Decrypt"]
        Resource = [var.tls.kms_key_arn]
        Condition = {
          StringEquals = { "kms:ViaService" = "secretsmanager.${data.aws_region.current.name}.amazonaws.com" }
        }
      },
    ]
  })
}
