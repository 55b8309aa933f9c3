output "host" {
  value = aws_route53_record.this.fqdn
}

output "private_ip" {
  value = aws_instance.this.private_ip
}

output "instance_id" {
  value = aws_instance.this.id
}
