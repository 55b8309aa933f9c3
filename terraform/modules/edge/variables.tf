variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "instances" {
  type    = number
  default = 2
  validation {
    condition     = var.instances >= 1
    error_message = "an edge needs at least one instance."
  }
}

variable "tls_certificate_arn" {
  description = "An ACM certificate the load balancer terminates client TLS with (HTTP/2 offered by ALPN, for gRPC and gRPC-Web); empty: the listener passes TCP through to edges that terminate TLS themselves."
  type        = string
  default     = ""
}

variable "port" {
  type    = number
  default = 7200
}

variable "routers" {
  type = list(string)
}

variable "tls" {
  description = "The certificate bundles: the folder `cellmesh pki issue-all` wrote, the KMS key secrets are encrypted with, and the recovery window of a deleted secret (days; 0: none)."
  type = object({
    dir           = string
    kms_key_arn   = string
    recovery_days = optional(number, 7)
  })
}

variable "token_secret" {
  description = "Signs and checks client tokens (the edge requires 16 bytes or more)."
  type        = string
  sensitive   = true
  validation {
    condition     = length(var.token_secret) >= 16
    error_message = "token_secret must be at least 16 bytes."
  }
}

variable "zone_id" {
  type = string
}

variable "zone_name" {
  type = string
}

variable "vpc_id" {
  type = string
}

variable "public_subnet_ids" {
  description = "Where the load balancer listens."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Where the edge instances run."
  type        = list(string)
}

variable "deletion_protection" {
  description = "The load balancer cannot be deleted until this is turned off."
  type        = bool
  default     = true
}

variable "security_group_ids" {
  type = list(string)
}

variable "instance_type" {
  type    = string
  default = "c6i.large"
}

variable "ami_id" {
  type    = string
  default = ""
}

variable "cellmesh_url" {
  type = string
}

variable "telemetry" {
  description = "Metrics port, OTLP endpoint and sample ratio (see ../config)."
  type        = any
  default     = {}
}
