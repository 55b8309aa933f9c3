output "host" {
  value = aws_route53_record.this.fqdn
}

output "private_ip" {
  value = aws_instance.this.private_ip
}

output "instance_id" {
  value = aws_instance.this.id
}

output "role_arn" {
  value = aws_iam_role.this.arn
}

output "tls_secret_arn" {
  value = var.tls == null ? "" : aws_secretsmanager_secret.tls[0].arn
}
