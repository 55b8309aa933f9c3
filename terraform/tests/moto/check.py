"""What the moto apply of terraform/envs/example left.

  check.py ENDPOINT acm TLS_DIR          imports the eu-west-1 edge's certificate
                                        into ACM and prints its ARN
  check.py ENDPOINT present TLS_DIR VARS what the apply must have made
  check.py ENDPOINT absent VARS          what the destroy must have removed
"""
import base64
import json
import sys

import boto3

endpoint, what = sys.argv[1:3]


def client(service, region):
    return boto3.client(service, endpoint_url=endpoint, region_name=region,
                        aws_access_key_id="test", aws_secret_access_key="test")


def instances(region):
    ec2 = client("ec2", region)
    found = []
    for r in ec2.describe_instances()["Reservations"]:
        for i in r["Instances"]:
            if i["State"]["Name"] in ("pending", "running"):
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                found.append((i, tags))
    return found


def stem(name, deployment, region, role):
    """The certificate file stem `cellmesh pki issue-all` gives a node."""
    rest = name[len(f"{deployment}-{region}-{role}-"):]
    return {"cell": f"cell-{region}-{rest}", "router": f"router-{rest}",
            "edge": f"edge-{region}", "control-plane": f"control-plane-{rest}",
            "etcd": f"etcd-{rest}"}[role]


def own_secret_only(iam, instance, secret_arn):
    """The instance's role reads exactly its own secret, and decrypts only
    through Secrets Manager."""
    profile = instance["IamInstanceProfile"]["Arn"].split("/")[-1]
    roles = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
    assert len(roles) == 1, roles
    role = roles[0]["RoleName"]
    assert not iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"], role
    readable = []
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        doc = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        for st in doc["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            assert "*" not in resources, (role, st)
            if any(a.startswith("secretsmanager:") for a in actions):
                assert actions == ["secretsmanager:GetSecretValue"], (role, st)
                readable += resources
            if any(a.startswith("kms:") for a in actions):
                assert actions == ["kms:Decrypt"], (role, st)
                assert "kms:ViaService" in json.dumps(st.get("Condition", {})), (role, st)
    assert readable == [secret_arn], (role, readable, secret_arn)
    return role


def check_present(tls_dir, variables):
    deployment = variables["deployment"]
    iam = client("iam", "us-east-1")
    roles, nodes = set(), 0
    for region, spec in variables["regions"].items():
        ec2, sm = client("ec2", region), client("secretsmanager", region)
        elb = client("elbv2", region)
        secrets = {s["Name"]: s for s in sm.list_secrets()["SecretList"]}
        keys = {k["KeyId"] for k in client("kms", region).list_keys()["Keys"]}
        for instance, tags in instances(region):
            name, role = tags["Name"], tags["cellmesh:role"]
            assert "PublicIpAddress" not in instance, (name, instance.get("PublicIpAddress"))
            data = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
            user_data = base64.b64decode(data["UserData"]["Value"]).decode()
            assert "PRIVATE KEY" not in user_data and "cluster_secret" not in user_data, name
            secret = secrets.get(f"{name}/tls")
            if role == "etcd":
                assert "ETCD_CLIENT_CERT_AUTH=true" in user_data and "http://" not in user_data, name
            else:
                assert "\n[tls]\n" in user_data and "insecure_plaintext" not in user_data, name
            assert secret and secret["KmsKeyId"].split("/")[-1] in keys, (name, secret)
            roles.add(own_secret_only(iam, instance, secret["ARN"]))
            bundle = json.loads(sm.get_secret_value(SecretId=secret["ARN"])["SecretString"])
            expected = stem(name, deployment, region, role)
            assert bundle["cert"] == open(f"{tls_dir}/{expected}.pem").read(), (name, expected)
            assert bundle["key"] == open(f"{tls_dir}/{expected}.key").read(), (name, expected)
            assert bundle["ca"] == open(f"{tls_dir}/ca.pem").read(), name
            nodes += 1
        listeners = [l for lb in elb.describe_load_balancers()["LoadBalancers"]
                     for l in elb.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]]
        assert len(listeners) == 1, listeners
        want = "TLS" if spec.get("edge_certificate_arn") else "TCP"
        assert listeners[0]["Protocol"] == want, (region, listeners[0])
        if want == "TLS":
            assert listeners[0]["Certificates"][0]["CertificateArn"] == spec["edge_certificate_arn"]
        groups = {g["GroupName"]: g["IpPermissions"] for g in ec2.describe_security_groups()["SecurityGroups"]}
        edge = groups[f"{deployment}-edge"]
        assert [(p["FromPort"], p["ToPort"]) for p in edge] == [(7200, 7200)], edge
        metrics = groups[f"{deployment}-metrics"]
        assert [(p["FromPort"], p["ToPort"]) for p in metrics] == [(9464, 9464)], metrics
        assert [r["CidrIp"] for r in metrics[0]["IpRanges"]] == variables["monitoring_cidrs"], metrics
        internal = groups[f"{deployment}-internal"]
        assert all(p["FromPort"] != 9464 for p in internal), internal
        subnets = ec2.describe_subnets()["Subnets"]
        assert not [s for s in subnets if s["MapPublicIpOnLaunch"] and not s.get("DefaultForAz")], region
    routers = sum(s["router_replicas"] for s in variables["regions"].values())
    cells = sum(s["cells"] for s in variables["regions"].values())
    expected = routers + cells + 2 * len(variables["regions"]) + 2 + 3
    assert nodes == expected and len(roles) == expected, (nodes, len(roles), expected)
    r53 = client("route53", "us-east-1")
    zones = {z["Name"]: z["Id"] for z in r53.list_hosted_zones()["HostedZones"]}
    public = zones[variables["domain"] + "."]
    records = r53.list_resource_record_sets(HostedZoneId=public)["ResourceRecordSets"]
    latency = [r for r in records if r["Type"] == "CNAME" and r.get("Region")]
    assert sorted(r["Region"] for r in latency) == sorted(variables["regions"]), latency
    print(f"applied: {nodes} instances (3 of them etcd members), none with a public address; "
          f"{len(roles)} instance roles, each reading only its own certificate secret (KMS through "
          f"Secrets Manager only), the bundle the one issued for that node; no key or shared secret "
          f"in user data; edge listeners TLS where a certificate is given, TCP elsewhere; "
          f"metrics scraped from the monitoring subnet only; "
          f"{len(latency)} latency records")


def check_absent(variables):
    left = []
    for region in variables["regions"]:
        left += [tags["Name"] for _, tags in instances(region)]
        left += [s["Name"] for s in client("secretsmanager", region).list_secrets()["SecretList"]]
        left += [lb["LoadBalancerName"] for lb in client("elbv2", region).describe_load_balancers()["LoadBalancers"]]
    left += [z["Name"] for z in client("route53", "us-east-1").list_hosted_zones()["HostedZones"]]
    assert not left, left
    print("destroyed: no instance, secret, load balancer or zone left")


if what == "acm":
    tls = sys.argv[3]
    acm = client("acm", "eu-west-1")
    print(acm.import_certificate(Certificate=open(f"{tls}/edge-eu-west-1.pem", "rb").read(),
                                 PrivateKey=open(f"{tls}/edge-eu-west-1.key", "rb").read(),
                                 CertificateChain=open(f"{tls}/ca.pem", "rb").read())["CertificateArn"])
elif what == "present":
    check_present(sys.argv[3], json.load(open(sys.argv[4])))
else:
    check_absent(json.load(open(sys.argv[3])))
