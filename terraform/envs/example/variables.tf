variable "deployment" {
  description = "Name prefixed to every resource."
  type        = string
  default     = "cellmesh"
}

variable "regions" {
  description = "Per AWS region: cells, router replicas, cell data volume (GiB), Kafka partitions (`cellmesh plan --tfvars` writes this)."
  type = map(object({
    cells              = number
    router_replicas    = number
    data_volume_gib    = optional(number, 100)
    kafka_partitions   = optional(number, 0)
    cell_instance_type = optional(string, "m6i.large")
    # An ACM certificate: the edges' load balancer terminates client TLS
    # with it (empty: it passes TCP through to edges that terminate TLS).
    edge_certificate_arn = optional(string, "")
  }))
  validation {
    condition     = length(var.regions) > 0
    error_message = "regions: name at least one region."
  }
  validation {
    condition     = alltrue([for r in keys(var.regions) : contains(["eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-southeast-1", "ap-northeast-1"], r)])
    error_message = "regions: an unknown region; supported are eu-west-1, eu-central-1, us-east-1, us-west-2, ap-southeast-1, ap-northeast-1."
  }
  validation {
    condition     = alltrue([for r in values(var.regions) : r.edge_certificate_arn == "" || can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/", r.edge_certificate_arn))])
    error_message = "regions: edge_certificate_arn must be an ACM certificate ARN (or empty)."
  }
  validation {
    condition     = alltrue([for r in values(var.regions) : r.cells >= 1 && r.cells <= 100])
    error_message = "regions: every region needs between 1 and 100 cells."
  }
  validation {
    condition     = sum([for r in values(var.regions) : r.router_replicas]) >= 3 && sum([for r in values(var.regions) : r.router_replicas]) % 2 == 1
    error_message = "regions: the router replicas of all regions must add up to an odd number, at least 3."
  }
}

variable "primary_region" {
  description = "Where etcd and the control plane run (one of regions)."
  type        = string
  default     = "eu-west-1"
  validation {
    condition     = contains(keys(var.regions), var.primary_region)
    error_message = "primary_region must be one of the regions deployed."
  }
}

variable "kafka" {
  description = "MSK per region instead of the cells' embedded queue."
  type        = bool
  default     = false
}

variable "domain" {
  description = "The public domain clients resolve (im.<domain>)."
  type        = string
  default     = "example.com"
}

variable "public_zone_id" {
  description = "An existing Route53 zone for domain; empty creates one."
  type        = string
  default     = ""
}

variable "internal_domain" {
  type    = string
  default = "cellmesh.internal"
}

variable "tls_dir" {
  description = "The folder of the deployment's CA and every node's certificate: `cellmesh pki init --dir DIR`, then `cellmesh pki issue-all --dir DIR --tfvars terraform.tfvars.json`. Each node's bundle goes into its own Secrets Manager secret (and so through this state: keep it encrypted, see terraform/README.md). ca.key is not read."
  type        = string
  validation {
    condition     = fileexists("${var.tls_dir}/ca.pem") && fileexists("${var.tls_dir}/crl.pem")
    error_message = "tls_dir holds no CA (ca.pem, crl.pem): run `cellmesh pki init --dir DIR` and `cellmesh pki issue-all --dir DIR --tfvars terraform.tfvars.json`."
  }
}

variable "secret_recovery_days" {
  description = "How long a destroyed node's certificate secret can still be recovered (0: deleted at once; else 7 to 30)."
  type        = number
  default     = 7
}

variable "control_plane_replicas" {
  description = "Control-plane replicas in primary_region (one active; `cellmesh pki issue-all` reads this too)."
  type        = number
  default     = 2
}

variable "console_token" {
  description = "The web console's read-only credential."
  type        = string
  sensitive   = true
  default     = "change-me-console-token"
}

variable "token_secret" {
  type      = string
  sensitive = true
  default   = "change-me-token-secret"
}

variable "ami_id" {
  description = "Empty: the latest Debian 12 in each region."
  type        = string
  default     = ""
}

variable "cellmesh_url" {
  description = "Where instances download the cellmesh binary."
  type        = string
  default     = "https://downloads.example.com/cellmesh/latest/cellmesh-linux-amd64"
}

variable "telemetry" {
  description = "Every process's `/metrics` port (scraped from monitoring_cidrs only) and where its traces go: an OTLP/gRPC collector (`http://collector.example:4317`; empty: no traces) with the share of traces sampled."
  type = object({
    metrics_port  = optional(number, 9464)
    otlp_endpoint = optional(string, "")
    sample_ratio  = optional(number, 0.05)
  })
  default = {}
  validation {
    condition     = var.telemetry.metrics_port >= 1024 && var.telemetry.metrics_port < 32768
    error_message = "telemetry.metrics_port must be between 1024 and 32767 (below the kernel's ephemeral range)."
  }
  validation {
    condition     = var.telemetry.sample_ratio >= 0 && var.telemetry.sample_ratio <= 1
    error_message = "telemetry.sample_ratio must be between 0 and 1."
  }
  validation {
    condition     = var.telemetry.otlp_endpoint == "" || can(regex("^https?://[^/]+:[0-9]+$", var.telemetry.otlp_endpoint))
    error_message = "telemetry.otlp_endpoint must be empty or http(s)://host:port."
  }
}

variable "monitoring_cidrs" {
  description = "The monitoring subnets (Prometheus) allowed to scrape every process's metrics port. Empty: nobody can."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for c in var.monitoring_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "monitoring_cidrs must be CIDR blocks, and not 0.0.0.0/0."
  }
}
