{{/* The chart's name, or nameOverride. */}}
{{- define "crc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release name if it contains the name, else "<release>-<name>". */}}
{{- define "crc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "crc.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod selector (Helm's pair). Immutable on a Deployment: see the chart README's upgrade notes. */}}
{{- define "crc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "crc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object: the selector pair, what deploy/kustomization.yaml adds, and Helm's. */}}
{{- define "crc.labels" -}}
{{ include "crc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: route-controller
app.kubernetes.io/part-of: cloud-route-controller
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The Lease's name: leaderElection.resourceName, with "-dry-run" appended under dryRun so that a shadow never holds a writing release's Lease. */}}
{{- define "crc.leaseName" -}}
{{- if .Values.dryRun -}}
{{- printf "%s-dry-run" .Values.leaderElection.resourceName -}}
{{- else -}}
{{- .Values.leaderElection.resourceName -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "crc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "crc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The credentials Secret's name, or "" when no credentials come from a Secret. */}}
{{- define "crc.secretName" -}}
{{- if .Values.credentials.create -}}
{{- printf "%s-credentials" (include "crc.fullname" .) -}}
{{- else -}}
{{- .Values.credentials.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* Whether the ConfigMap (cloudConfig) is rendered: always, unless an existing Secret or ConfigMap alone holds the config. */}}
{{- define "crc.configMap" -}}
{{- if or (not (or .Values.cloudConfigSecret.existingSecret .Values.cloudConfigConfigMap.existingConfigMap)) .Values.cloudConfig -}}
true
{{- end -}}
{{- end -}}

{{/* Refuses values that would render a controller that cannot work, with a message saying why. */}}
{{- define "crc.validate" -}}
{{- $providers := list "aws" "openstack" "hcloud" "azure" "gce" "memory" -}}
{{- if not (has .Values.provider $providers) -}}
{{- fail (printf "provider must be one of %s, got %q" (join ", " $providers) (toString .Values.provider)) -}}
{{- end -}}
{{- if not .Values.clusterCIDRs -}}
{{- fail "clusterCIDRs must list the cluster's pod CIDR(s), e.g. [10.244.0.0/16]" -}}
{{- end -}}
{{- if gt (len .Values.clusterCIDRs) 2 -}}
{{- fail (printf "clusterCIDRs takes one CIDR, or one IPv4 and one IPv6 CIDR; got %d" (len .Values.clusterCIDRs)) -}}
{{- end -}}
{{- if hasKey .Values "replicas" -}}
{{- fail "replicas was renamed replicaCount, as in Helm's own charts" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: several replicas without a Lease would all change routes" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.cloudConfigSecret.existingSecret .Values.cloudConfigConfigMap.existingConfigMap -}}
{{- fail "cloudConfigSecret.existingSecret and cloudConfigConfigMap.existingConfigMap both name the provider's own config file: set one" -}}
{{- end -}}
{{- if .Values.cloudConfigConfigMap.existingConfigMap -}}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString .Values.cloudConfigConfigMap.key)) -}}
{{- fail (printf "cloudConfigConfigMap.key must be a ConfigMap key (letters, digits, '-', '_', '.'); got %q" (toString .Values.cloudConfigConfigMap.key)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.credentials.create .Values.credentials.existingSecret -}}
{{- fail "credentials: set either create: true (with data) or existingSecret, not both" -}}
{{- end -}}
{{- range .Values.credentials.env -}}
{{- if not (and .name .key) -}}
{{- fail (printf "every credentials.env entry needs a name (the variable) and a key (in the Secret); got %v" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.credentials.create (not .Values.credentials.data) -}}
{{- fail "credentials.create is true but credentials.data is empty" -}}
{{- end -}}
{{- if and .Values.credentials.env (not (include "crc.secretName" .)) -}}
{{- fail "credentials.env names Secret keys but there is no Secret: set credentials.existingSecret, or create: true with data" -}}
{{- end -}}
{{- if .Values.cloudConfigSecret.existingSecret -}}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString .Values.cloudConfigSecret.key)) -}}
{{- fail (printf "cloudConfigSecret.key must be a Secret key (letters, digits, '-', '_', '.'), the file's name in /etc/cloud-route-controller-secret; got %q" (toString .Values.cloudConfigSecret.key)) -}}
{{- end -}}
{{- end -}}
{{- range $k, $_ := .Values.podLabels -}}
{{- if has $k (list "app.kubernetes.io/name" "app.kubernetes.io/instance") -}}
{{- fail (printf "podLabels must not set %q: it is part of the Deployment's pod selector" $k) -}}
{{- end -}}
{{- end -}}
{{- $names := list "POD_NAME" "POD_NAMESPACE" -}}
{{- range concat .Values.credentials.env .Values.extraEnv -}}
{{- if not .name -}}
{{- fail (printf "every extraEnv entry needs a name; got %v" .) -}}
{{- end -}}
{{- if has .name $names -}}
{{- fail (printf "the environment variable %s is set twice (credentials.env and extraEnv, or one the chart sets itself)" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $volumes := list "cloud-config" "cloud-config-secret" "cloud-config-configmap" "serving-cert" -}}
{{- range .Values.extraVolumes -}}
{{- if has .name $volumes -}}
{{- fail (printf "extraVolumes: the volume name %s is taken (the chart's own, or listed twice)" (toString .name)) -}}
{{- end -}}
{{- $volumes = append $volumes .name -}}
{{- end -}}
{{- range .Values.extraVolumeMounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "extraVolumeMounts mounts %s, which is no volume of the pod (add it to extraVolumes)" (toString .name)) -}}
{{- end -}}
{{- if hasPrefix "/etc/cloud-route-controller" (toString .mountPath) -}}
{{- fail (printf "extraVolumeMounts: %s would hide or shadow the cloud config mounted at /etc/cloud-route-controller(-secret)" (toString .mountPath)) -}}
{{- end -}}
{{- end -}}
{{- $valued := dict "--reconcile-mode" .Values.reconcileMode "--route-reconciliation-period" .Values.routeReconciliationPeriod "--route-drift-check-period" .Values.routeDriftCheckPeriod "--leader-elect-lease-duration" .Values.leaderElection.leaseDuration "--leader-elect-renew-deadline" .Values.leaderElection.renewDeadline "--leader-elect-retry-period" .Values.leaderElection.retryPeriod "--logging-format" .Values.logging.format -}}
{{- if not (kindIs "invalid" .Values.logging.verbosity) }}{{ $_ := set $valued "--v" "set" }}{{ end -}}
{{- range .Values.extraArgs -}}
{{- $arg := toString . -}}
{{- range $flag, $value := $valued -}}
{{- if and $value (or (eq $arg $flag) (hasPrefix (printf "%s=" $flag) $arg)) -}}
{{- fail (printf "%s is set twice: by its chart value and in extraArgs (%s); keep one" $flag $arg) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.credentials.create -}}
{{- range .Values.credentials.env -}}
{{- if not (hasKey $.Values.credentials.data .key) -}}
{{- fail (printf "credentials.env %s reads key %q, which credentials.data does not have" .name .key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* --route-ip-families: routeIPFamilies when set, else the families of clusterCIDRs (a ":" makes a CIDR IPv6), IPv4 first. */}}
{{- define "crc.routeIPFamilies" -}}
{{- if .Values.routeIPFamilies -}}
{{- join "," .Values.routeIPFamilies -}}
{{- else -}}
{{- $families := list -}}
{{- range .Values.clusterCIDRs -}}
{{- $families = append $families (ternary "IPv6" "IPv4" (contains ":" .)) -}}
{{- end -}}
{{- $families = uniq $families -}}
{{- if and (has "IPv4" $families) (has "IPv6" $families) -}}
IPv4,IPv6
{{- else -}}
{{- join "," $families -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The flags of `plan` that make it compute what the Deployment's `run` does: the same cluster, CIDRs, families, Node selector, provider, cloud config and deletion grace. */}}
{{/*
The arguments of `plan` that change what it computes, as the Deployment
runs with them: a JSON list, for the notes' command and the test hook.
*/}}
{{- define "crc.planArgList" -}}
{{- $args := list (printf "--cluster-cidr=%s" (join "," .Values.clusterCIDRs)) (printf "--cluster-name=%s" .Values.clusterName) }}
{{- with .Values.routeNodeSelector }}{{ $args = append $args (printf "--node-selector=%s" .) }}{{ end }}
{{- $args = append $args (printf "--route-ip-families=%s" (include "crc.routeIPFamilies" .)) }}
{{- $args = append $args (printf "--cloud-provider=%s" .Values.provider) }}
{{- range (include "crc.cloudConfigArgList" . | fromJsonArray) }}{{ $args = append $args . }}{{ end }}
{{- $args = append $args (printf "--max-route-deletions=%v" .Values.maxRouteDeletions) }}
{{- range .Values.extraArgs }}
{{- if or (hasPrefix "--route-deletion-grace=" .) (hasPrefix "--kube-api-qps=" .) (hasPrefix "--kube-api-burst=" .) }}{{ $args = append $args . }}{{ end }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{/* The plan arguments as one shell line, quoted where a shell needs it. */}}
{{- define "crc.planFlags" -}}
{{- $out := list }}
{{- range (include "crc.planArgList" . | fromJsonArray) }}
{{- if regexMatch "^[-A-Za-z0-9=,./:_]+$" . }}{{ $out = append $out . }}{{ else }}{{ $out = append $out (squote .) }}{{ end }}
{{- end }}
{{- join " " $out }}
{{- end }}

{{/* The --cloud-config flags, as a JSON list. */}}
{{- define "crc.cloudConfigArgList" -}}
{{- $args := list }}
{{- with .Values.cloudConfigSecret.existingSecret }}{{ $args = append $args (printf "--cloud-config=/etc/cloud-route-controller-secret/%s" $.Values.cloudConfigSecret.key) }}{{ end }}
{{- with .Values.cloudConfigConfigMap.existingConfigMap }}{{ $args = append $args (printf "--cloud-config=/etc/cloud-route-controller-configmap/%s" $.Values.cloudConfigConfigMap.key) }}{{ end }}
{{- if include "crc.configMap" . }}{{ $args = append $args "--cloud-config=/etc/cloud-route-controller/cloud.yaml" }}{{ end }}
{{- toJson $args }}
{{- end }}

{{/* The image reference. */}}
{{- define "crc.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}

{{/*
Where the pods run and as whom, shared by the Deployment and the test hook:
service account, pull secrets, host network, tolerations, node selector,
security context (indented for a pod spec).
*/}}
{{- define "crc.podPlacement" -}}
serviceAccountName: {{ include "crc.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.hostNetwork }}
# The cloud API's name through the node's resolver, not cluster DNS
# (itself a pod on the network this controller makes work).
hostNetwork: true
dnsPolicy: Default
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The container's environment: identity and credentials (a list). */}}
{{- define "crc.env" -}}
# The Lease holder identity: unique per replica.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- $secret := include "crc.secretName" . }}
{{- range .Values.credentials.env }}
# Credentials come from a Secret, never from the ConfigMap.
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .key }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The container's mounts: cloud configs, serving certificate, extras (a list). */}}
{{- define "crc.volumeMounts" -}}
{{- if include "crc.configMap" . }}
- name: cloud-config
  mountPath: /etc/cloud-route-controller
  readOnly: true
{{- end }}
{{- if .Values.cloudConfigSecret.existingSecret }}
- name: cloud-config-secret
  mountPath: /etc/cloud-route-controller-secret
  readOnly: true
{{- end }}
{{- if .Values.cloudConfigConfigMap.existingConfigMap }}
- name: cloud-config-configmap
  mountPath: /etc/cloud-route-controller-configmap
  readOnly: true
{{- end }}
{{- if .Values.metrics.tlsSecretName }}
- name: serving-cert
  mountPath: /etc/cloud-route-controller-tls
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The pod's volumes for crc.volumeMounts (a list). */}}
{{- define "crc.volumes" -}}
{{- with .Values.metrics.tlsSecretName }}
- name: serving-cert
  secret:
    secretName: {{ . }}
{{- end }}
{{- if include "crc.configMap" . }}
- name: cloud-config
  configMap:
    name: {{ include "crc.fullname" . }}-config
{{- end }}
{{- with .Values.cloudConfigSecret.existingSecret }}
# A config file that holds credentials (the cloud-controller-manager's
# own, say), from its Secret.
- name: cloud-config-secret
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.Values.cloudConfigSecret.key }}
        path: {{ $.Values.cloudConfigSecret.key }}
{{- end }}
{{- with .Values.cloudConfigConfigMap.existingConfigMap }}
# The cloud-controller-manager's own config, from its ConfigMap.
- name: cloud-config-configmap
  configMap:
    name: {{ . }}
    items:
      - key: {{ $.Values.cloudConfigConfigMap.key }}
        path: {{ $.Values.cloudConfigConfigMap.key }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Where the monitors and the rule go: monitoring.namespace, or the release's. */}}
{{- define "crc.monitoringNamespace" -}}
{{- .Values.monitoring.namespace | default .Release.Namespace -}}
{{- end }}

{{/* Whether the cluster serves the Prometheus Operator's API (its CRDs). */}}
{{- define "crc.monitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end -}}
{{- end }}
