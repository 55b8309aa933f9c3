"""What the moto apply left: `check.py ENDPOINT present VPC ZONE` or
`check.py ENDPOINT absent VPC ZONE`."""
import sys

import boto3

endpoint, expect, vpc, zone = sys.argv[1:5]
kw = dict(endpoint_url=endpoint, region_name="eu-west-1",
          aws_access_key_id="test", aws_secret_access_key="test")
ec2, r53 = boto3.client("ec2", **kw), boto3.client("route53", **kw)
vpcs = [v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]]
zones = [z["Id"].split("/")[-1] for z in r53.list_hosted_zones()["HostedZones"]]
if expect == "absent":
    assert vpc not in vpcs, f"VPC {vpc} still exists"
    assert zone not in zones, f"zone {zone} still exists"
    print("destroyed: no VPC, no zone left")
    sys.exit(0)
assert vpc in vpcs, f"no VPC {vpc} in {vpcs}"
subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
assert len(subnets) == 4, f"{len(subnets)} subnets"
groups = {g["GroupName"]: g for g in ec2.describe_security_groups(
    Filters=[{"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]}
edge = groups["moto-edge"]["IpPermissions"]
assert [(p["FromPort"], p["ToPort"]) for p in edge] == [(7200, 7200)], edge
internal = groups["moto-internal"]["IpPermissions"]
ranges = sorted((p["FromPort"], p["ToPort"]) for p in internal)
assert ranges == [(2379, 2380), (7100, 7101), (7200, 7200), (7300, 7301), (7400, 7400)], ranges
for p in internal:
    assert {r["CidrIp"] for r in p["IpRanges"]} == {"10.10.0.0/16", "10.11.0.0/16"}, p
metrics = groups["moto-metrics"]["IpPermissions"]
assert [(p["FromPort"], p["ToPort"]) for p in metrics] == [(9464, 9464)], metrics
assert [r["CidrIp"] for r in metrics[0]["IpRanges"]] == ["10.10.200.0/24"], metrics
nats = ec2.describe_nat_gateways(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["NatGateways"]
assert len(nats) == 1, nats
public = [s for s in subnets if s["MapPublicIpOnLaunch"]]
assert not public, public
records = r53.list_resource_record_sets(HostedZoneId=zone)["ResourceRecordSets"]
latency = [r for r in records if r["Name"].startswith("im.example.test") and r["Type"] == "CNAME"]
assert sorted(r["Region"] for r in latency) == ["eu-west-1", "us-east-1"], latency
assert all(r.get("HealthCheckId") for r in latency), latency
checks = r53.list_health_checks()["HealthChecks"]
assert len(checks) >= 2, checks
names = [z["Name"] for z in r53.list_hosted_zones()["HostedZones"]]
assert any(n.startswith("eu-west-1.cellmesh.internal") for n in names), names
print(f"applied: VPC {vpc} with 4 subnets (no public addresses), a NAT gateway, "
      f"3 security groups (internal: 5 port ranges; metrics from the monitoring subnet only); "
      f"{len(latency)} latency records with health checks; the private zone")
